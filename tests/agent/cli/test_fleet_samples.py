"""`edge-agent fleet samples`: its arguments refused before any broker is asked (a bad
``--since``, camera or ``--max-requests``), and the times ``--since`` takes. The fetch itself
over a real mosquitto is tests/e2e/test_samples.py."""

from __future__ import annotations

import argparse

import pytest

from agent.cli.fleet_samples import since_time
from agent.cli.main import main

NOW = 1_765_000_000.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0.0),
        ("1765000000.5", 1_765_000_000.5),
        ("24h", NOW - 86400),
        ("90m", NOW - 5400),
        ("7d", NOW - 7 * 86400),
        ("2025-12-06T05:46:40", 1_765_000_000.0),  # UTC unless it says
        ("2025-12-06T06:46:40+01:00", 1_765_000_000.0),
    ],
)
def test_since_takes_unix_seconds_iso_times_and_durations_ago(text: str, expected: float) -> None:
    assert since_time(text, NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["yesterday", "-5", "1e12", "24x", ""])
def test_since_refuses_what_is_no_time(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--since"):
        since_time(text, NOW)


def test_a_bad_since_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["fleet", "samples", "dev1", "--since", "yesterday", "--broker", "mqtt://127.0.0.1:1"])
    assert exited.value.code == 2 and "ISO 8601" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [(["cam/0"], "a camera name holds only"), (["--max-requests", "0"], "--max-requests must be 1 .. 1000")],
)
def test_bad_arguments_are_refused_before_the_broker_is_asked(
    capsys: pytest.CaptureFixture[str], extra: list[str], refusal: str
) -> None:
    status = main(["fleet", "samples", "dev1", *extra, "--broker", "mqtt://127.0.0.1:1", "--timeout", "1"])
    err = capsys.readouterr().err
    assert status == 1 and refusal in err and "Traceback" not in err
