"""`agent.mqtt.rollout_schedule`: schedules checked when made, waves and failure limits parsed, stable
wave shares, waves opening in order."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
from typing import Any

import pytest
from pydantic import ValidationError
from testkit.rollouts import HOUR, schedule
from testkit.store import A

from agent.mqtt.protocol import Desired, ProtocolError
from agent.mqtt.rollout_schedule import FailureLimit, parse_waves, position


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"waves": [10, 5, 100]}, "reach further than the one before"),
        ({"waves": [10, 50]}, "last wave must reach 100"),
        ({"waves": [0, 100]}, "above 0 and at most 100"),
        ({"waves": [50, 150]}, "above 0 and at most 100"),
        ({"waves": []}, "at least 1 item"),
        ({"waves": [float(i) for i in range(1, 101)]}, "at most 20 items"),
        ({"interval_s": -1}, "greater than or equal to 0"),
        ({"max_failures": {"devices": 1, "percent": 5}}, "not both or neither"),
        ({"max_failures": {}}, "not both or neither"),
        ({"on_halt": "explode"}, "'keep' or 'rollback'"),
    ],
)
def test_schedules_are_checked_when_made(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        schedule(**changes)


def test_a_desired_document_carries_its_schedule_and_an_old_device_would_refuse_it() -> None:
    desired = Desired(id="d", name="demo", version="1.0.0", sha256=A, size=1, chunk_size=1, chunks=1)
    staged = desired.model_copy(update={"rollout": schedule()})
    assert Desired.parse(staged.to_bytes(), "t").rollout == schedule()
    assert b'"rollout"' not in desired.to_bytes(), "a push without waves is what it always was"
    assert staged.canonical_bytes() != desired.canonical_bytes(), "the schedule is signed with the document"
    with pytest.raises(ProtocolError, match=r"halted\.reason"):
        Desired.parse(staged.to_bytes().replace(b'"on_halt"', b'"halted":{"at":1,"reason":1},"on_halt"'), "t")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1%,10%,50%,100%", [1, 10, 50, 100]), ("25, 100", [25, 100]), ("100%", [100])],
)
def test_waves_parse(text: str, expected: list[float]) -> None:
    assert parse_waves(text) == expected


@pytest.mark.parametrize("text", ["", "1%,,100%", "ten,100"])
def test_bad_waves_are_named(text: str) -> None:
    with pytest.raises(ValueError, match="are not percentages"):
        parse_waves(text)


@pytest.mark.parametrize(
    ("text", "failed", "started", "exceeded"),
    [
        ("0", 0, 10, False),
        ("0", 1, 10, True),
        ("3", 3, 10, False),
        ("3", 4, 10, True),
        ("5%", 1, 20, False),  # 5 % of 20 is 1
        ("5%", 2, 20, True),
        ("5%", 1, 2, True),  # a canary wave of two: one failure is half
        ("0%", 1, 200, True),
    ],
)
def test_failure_limits(text: str, failed: int, started: int, exceeded: bool) -> None:
    assert FailureLimit.parse(text).exceeded(failed, started) is exceeded


@pytest.mark.parametrize("text", ["many", "5%%", "-1", "150%", "1.5"])
def test_bad_failure_limits_are_named(text: str) -> None:
    with pytest.raises(ValueError, match=r"not a count \(3\) or a percentage|greater than or equal|less than"):
        FailureLimit.parse(text)


def test_waves_are_stable_shares_that_differ_per_deployment() -> None:
    rollout = schedule(waves=[1, 10, 50, 100])
    devices = [f"cam-{i:04d}" for i in range(4000)]
    waves = collections.Counter(rollout.wave_of("deploy-1", d) for d in devices)
    shares = [waves[0], waves[1], waves[2], waves[3]]
    assert [round(n / 40) for n in shares] == [1, 9, 40, 50], shares  # 1 %, 9 %, 40 %, 50 % of the fleet
    canaries = {d for d in devices if rollout.wave_of("deploy-1", d) == 0}
    other = {d for d in devices if rollout.wave_of("deploy-2", d) == 0}
    assert canaries and other and len(canaries & other) < len(canaries) / 2, "each deployment picks its canaries"
    assert all(0 <= position("x", d) < 100 for d in devices)


WAVES_OF = """
import sys
from agent.mqtt.rollout_schedule import Rollout
rollout = Rollout(waves=[1, 10, 50, 100], start=0, interval_s=0, max_failures={"devices": 0})
print(",".join(str(rollout.wave_of("deploy-1", f"cam-{i:04d}")) for i in range(400)))
"""


def test_a_devices_wave_is_the_same_in_every_process_and_every_version() -> None:
    """The device, the operator's watch and `fleet status` compute the waves each in their own
    process, often of different agent versions: the position is sha256 of "DEPLOYMENT\\nDEVICE"
    (its first 8 bytes, big-endian, over 2**64, times 100), never Python's per-process salted
    hash(). Pinned values, and two processes with different PYTHONHASHSEED agree."""
    assert position("deploy-1", "cam-0000") == pytest.approx(73.63433198064078, abs=1e-12)
    assert position("deploy-2", "cam-0000") == pytest.approx(85.36978629814533, abs=1e-12)
    assert position("deploy-1", "lobby-7") == pytest.approx(0.6363341505505653, abs=1e-12)
    assert schedule(waves=[1, 10, 50, 100]).wave_of("deploy-1", "lobby-7") == 0
    waves = [
        subprocess.run(
            [sys.executable, "-c", WAVES_OF],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    ]
    assert waves[0] == waves[1] and set(waves[0].strip().split(",")) == {"0", "1", "2", "3"}, waves


def test_waves_open_in_order_and_a_resume_moves_the_schedule_on() -> None:
    rollout = schedule()
    assert [rollout.opens_at(w) for w in range(3)] == [1000.0, 1000.0 + HOUR, 1000.0 + 2 * HOUR]
    assert [rollout.opened(t) for t in (999, 1000, 1000 + HOUR - 1, 1000 + HOUR, 1e9)] == [0, 1, 1, 2, 3]
    halted = rollout.halt(1000 + HOUR + 60, "2 of 5 failed")
    assert not halted.may_start(0, 1e9), "nobody starts while it is halted"
    resumed = halted.resume(1000 + HOUR + 60 + 600)
    assert resumed.halted is None and resumed.start == 1000 + 600
    assert resumed.may_start(1, 1000 + HOUR + 60 + 600), "the waves open at the halt stay open"
    assert resumed.opens_at(2) == 1000 + 2 * HOUR + 600, "the next wave opens as much later as it stood still"
    assert schedule(interval_s=0).opened(1000) == 3
