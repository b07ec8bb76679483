"""`edge-agent telemetry`: the table, ``--watch`` as JSON lines, bad arguments."""

from __future__ import annotations

import json

import pytest
from testkit import FAKES

from agent.cli import main


def test_the_text_table_names_every_reading(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    assert main(["telemetry", "--root", str(FAKES / "jetson-orin-nano")]) == 0
    out = capsys.readouterr().out
    assert "48.5 °C  (hottest of 9 zone(s))" in out
    assert "5.802 W  (VDD_IN)" in out
    assert "WARM 84.0 / HOT 94.0 / CRITICAL 99.5 °C (from trip points)" in out
    assert "40.0 %  2316 rpm" in out


def test_watch_repeats_as_json_lines(capsys) -> None:
    assert main(["telemetry", "--watch", "0.1", "--count", "3", "--json", "--root", str(FAKES / "jetson-nano")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["sensors"]["power_w"] for line in lines] == [6.72, 6.72, 6.72]


@pytest.mark.parametrize("args", [["--watch", "0"], ["--watch", "x"], ["--once", "--watch", "1"]])
def test_bad_watch_arguments_are_usage_errors(args: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["telemetry", *args])
    assert exit_info.value.code == 2
