"""`agent.cli.fleet_rollout` beside test_fleet_rollout.py: durations, the staging `fleet push`
asks for, and the rollout table `fleet rollout status` prints (its broker side: e2e/test_rollout.py)."""

from __future__ import annotations

import argparse
import time

import pytest

from agent.cli.failure import CliError
from agent.cli.fleet_rollout import duration, print_tally, staging
from agent.fleet.rollout_watch import Staging, Tally, WaveTally
from agent.mqtt.rollout_schedule import FailureLimit, Halt


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("600", 600), (" 1.5M ", 90), ("0", 0)],
)
def test_durations_in_their_units(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize(("text", "words"), [("soon", "not a duration"), ("5w", "not a duration"), ("-1m", "negative")])
def test_durations_refused(text: str, words: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=words):
        duration(text)


def _push(**changes: object) -> argparse.Namespace:
    base = {"waves": (10.0, 100.0), "target": "group:lobby", "wave_interval": 600.0, "on_halt": "keep"}
    return argparse.Namespace(**{**base, "max_failures": FailureLimit(devices=1), **changes})


def test_the_staging_a_push_asks_for() -> None:
    assert staging(_push(waves=None)) is None
    assert staging(_push(on_halt="rollback")) == Staging((10.0, 100.0), 600.0, FailureLimit(devices=1), "rollback")
    with pytest.raises(CliError, match="use --target group:NAME, not 'device:cam-1'"):
        staging(_push(target="device:cam-1"))
    with pytest.raises(CliError, match="--waves 10%,50%: ") as refused:
        staging(_push(waves=(10.0, 50.0)))
    assert "Value error" not in str(refused.value)


def test_the_rollout_table(capsys) -> None:
    now = time.time()
    rollout = Staging((10.0, 100.0), 3600.0, FailureLimit(devices=0), "keep").schedule(now - 60)
    waves = (WaveTally(1, 10.0, now - 60, 1, 1, 0, 1, 0), WaveTally(2, 100.0, now + 3540, 9, 0, 0, 0, 0))
    tally = Tally("d-1", "lobby", rollout, waves, 10, 1, 0, 1, 1, ("cam-3",), ("cam-9",))
    print_tally(tally)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == tally.summary()
    assert lines[1].split() == ["WAVE", "SHARE", "OPENS", "DEVICES", "STARTED", "SUCCEEDED", "FAILED", "RUNNING"]
    first, second = lines[2].split(), lines[3].split()
    assert first[:2] == ["1", "10%"] and first[4] == "(open)" and first[5:] == ["1", "1", "0", "1", "0"]
    assert second[:2] == ["2", "100%"] and second[4:6] == ["(in", "59"] and second[6] == "min)"
    header = lines[1]
    assert (lines[2][header.index("SUCCEEDED")], lines[2][header.index("FAILED")]) == ("0", "1"), "columns line up"
    assert lines[4:] == ["failed: cam-3", "unreadable deployment records (not counted as started): cam-9"]

    halted = rollout.model_copy(update={"halted": Halt(at=now, reason="too many failures")})
    print_tally(Tally("d-1", "lobby", halted, waves, 10, 1, 0, 1, 1, ()))
    assert capsys.readouterr().out.splitlines()[1].endswith(": too many failures")


def test_the_rollout_table_says_what_each_judged_device_saw(capsys) -> None:
    rollout = Staging((100.0,), 60.0, FailureLimit(devices=0), "rollback").schedule(time.time())
    waves = (WaveTally(1, 100.0, rollout.start, 3, 3, 1, 2, 0),)
    judged = (("cam-1", "shadow disagrees 0.31<0.8"), ("cam-22", "shadow agrees 0.91; probation blind 0.05<0.5"))
    print_tally(Tally("d-1", "lobby", rollout, waves, 3, 3, 1, 2, 1, ("cam-1", "cam-22"), quality=judged))
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("failed: cam-1, cam-22") + 1
    assert lines[at].startswith("quality (shadow before the switch, probation after")
    assert lines[at + 1 :] == [
        "  cam-1   shadow disagrees 0.31<0.8",
        "  cam-22  shadow agrees 0.91; probation blind 0.05<0.5",
    ]
