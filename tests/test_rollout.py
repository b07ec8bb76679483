"""Staged rollouts without a broker: the schedule's checks, each device's wave, the failure limit,
the device's plan (start, wait, hold, undo) and its undo on the store, the operator's tally; and
the chunk size that fits a broker's Maximum Packet Size."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.bundles.record import Deployment, State
from agent.daemon.rollout import Action, plan, undo_halted
from agent.errors import BundleError, ErrorCode
from agent.mqtt.limits import BrokerLimits, fit_chunk_size, largest_payload, publish_packet_size
from agent.mqtt.protocol import Desired, ProtocolError, Topics
from agent.mqtt.rollout import FailureLimit, Rollout, parse_waves, position
from tests.test_recovery import two_versions

A, B = "a" * 64, "b" * 64
HOUR = 3600.0


def schedule(**changes: Any) -> Rollout:
    values: dict[str, Any] = {
        "waves": [10, 50, 100],
        "start": 1000.0,
        "interval_s": HOUR,
        "max_failures": FailureLimit(devices=0),
    }
    return Rollout(**{**values, **changes})


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
    assert all(rollout.wave_of("deploy-1", d) == rollout.wave_of("deploy-1", d) for d in devices[:50])
    canaries = {d for d in devices if rollout.wave_of("deploy-1", d) == 0}
    other = {d for d in devices if rollout.wave_of("deploy-2", d) == 0}
    assert canaries and other and len(canaries & other) < len(canaries) / 2, "each deployment picks its canaries"
    assert all(0 <= position("x", d) < 100 for d in devices)


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


def record(state: State, deployment_id: str = "d1", code: ErrorCode | None = None, sha: str = B) -> Deployment:
    deployment = Deployment(id=deployment_id, sha256=sha, from_sha=A)
    deployment.to(state, BundleError(code, "why") if code else None)
    return deployment


def in_wave(rollout: Rollout, wave: int) -> str:
    """A device id that falls in `wave` of deployment d1."""
    return next(f"dev{i}" for i in range(1000) if rollout.wave_of("d1", f"dev{i}") == wave)


HALT = {"at": 1.0, "reason": "too many failures"}
FAILED_ITSELF = record(State.REJECTED, code=ErrorCode.CHUNK_CORRUPT)
UNDONE = record(State.ROLLED_BACK, code=ErrorCode.ROLLOUT_HALTED)
CASES = [
    # (rollout changes, device's wave, followed id, last record, current sha, now, action)
    ({}, 0, None, None, A, 1000.0, Action.START),
    ({}, 1, None, None, A, 1000.0, Action.WAIT),
    ({}, 1, None, None, A, 1000.0 + HOUR, Action.START),
    ({}, 0, "d1", record(State.SUCCEEDED), B, 1e9, Action.NOTHING),
    ({}, 0, None, record(State.DOWNLOADING), A, 1000.0, Action.START),  # resumes after a restart
    ({}, 1, None, record(State.DOWNLOADING), A, 999.0, Action.START),  # started: a clock that went back
    ({}, 0, None, record(State.SUCCEEDED), B, 1e9, Action.START),  # final, not yet followed: the deployer ends it
    ({}, 0, "d1", record(State.ROLLED_BACK, "rollback-x"), A, 1e9, Action.NOTHING),  # rolled back by a command
    ({}, 0, "d1", record(State.ROLLED_BACK, code=ErrorCode.ROLLOUT_HALTED), A, 1e9, Action.START),  # resumed
    ({"halted": HALT}, 0, None, None, A, 1e9, Action.HOLD),
    ({"halted": HALT}, 0, "d1", record(State.SUCCEEDED), B, 1e9, Action.NOTHING),  # keep
    ({"halted": HALT}, 0, None, record(State.DOWNLOADING), A, 1e9, Action.START),  # keep: it goes on
    ({"halted": HALT, "on_halt": "rollback"}, 0, "d1", record(State.SUCCEEDED), B, 1e9, Action.UNDO),
    ({"halted": HALT, "on_halt": "rollback"}, 0, None, record(State.DOWNLOADING), A, 1e9, Action.UNDO),
    ({"halted": HALT, "on_halt": "rollback"}, 0, "d1", record(State.SUCCEEDED), A, 1e9, Action.NOTHING),
    ({"halted": HALT, "on_halt": "rollback"}, 0, "d1", FAILED_ITSELF, A, 1e9, Action.NOTHING),
    ({"halted": HALT, "on_halt": "rollback"}, 0, "d1", UNDONE, A, 1e9, Action.HOLD),
]


@pytest.mark.parametrize(("changes", "wave", "followed", "last", "current", "now", "action"), CASES)
def test_the_device_plan(
    changes: dict[str, Any],
    wave: int,
    followed: str | None,
    last: Deployment | None,
    current: str,
    now: float,
    action: Action,
) -> None:
    rollout = schedule(**changes)
    desired = Desired(id="d1", name="demo", version="2.0.0", sha256=B, size=1, chunk_size=1, chunks=1, rollout=rollout)
    device = in_wave(rollout, wave)
    result = plan(desired, device, followed, last, current, now)
    assert result.action == action
    assert result.position is not None and result.position.wave == wave + 1 and result.position.waves == 3
    assert (result.wake_at is not None) == (action == Action.WAIT)
    without = plan(desired.model_copy(update={"rollout": None}), device, followed, last, current, now)
    assert without.position is None and without.action == (Action.NOTHING if followed == "d1" else Action.START)


def test_undo_puts_the_pointers_back_or_ends_a_download(tmp_path: Path) -> None:
    store = two_versions(tmp_path)  # B serving, A before it
    taken = Deployment(id="d1", sha256=B, from_sha=A, previous_before=None)
    taken.to(State.SUCCEEDED)
    undone = undo_halted(store, taken, "3 of 10 failed")
    assert (undone.state, undone.error and undone.error["code"]) == (State.ROLLED_BACK, "ROLLOUT_HALTED")
    assert "3 of 10 failed" in (undone.error or {})["message"]
    assert store.current_sha() == A and store.info(B) is None, "the version it brought is gone"
    assert store.last_deployment() == undone
    waiting = Deployment(id="d2", sha256=B, from_sha=A)
    waiting.to(State.DOWNLOADING)
    assert undo_halted(store, waiting, "").state == State.REJECTED and store.current_sha() == A


CHUNK_TOPIC = Topics().chunk("f" * 64, 65536)


@pytest.mark.parametrize(
    ("requested", "maximum", "expected", "changed"),
    [
        (None, None, 256 * 1024, False),
        (1 << 20, None, 1 << 20, False),
        (None, 268_435_455, 256 * 1024, False),
        (None, 65_536, 63 * 1024, True),
        (256 * 1024, 131_072, 127 * 1024, True),  # AWS IoT Core's 128 KB
        (16 * 1024, 65_536, 16 * 1024, False),
    ],
)
def test_chunks_fit_the_broker(requested: int | None, maximum: int | None, expected: int, changed: bool) -> None:
    size, why = fit_chunk_size(requested, BrokerLimits(maximum_packet_size=maximum), CHUNK_TOPIC)
    assert size == expected and (why is not None) == changed
    if maximum is not None:
        assert publish_packet_size(CHUNK_TOPIC, size) <= maximum
        assert largest_payload(maximum, CHUNK_TOPIC) >= size
    if why is not None:
        assert str(maximum) in why and str(expected) in why


def test_a_broker_that_takes_no_chunk_says_what_to_do() -> None:
    with pytest.raises(ValueError, match="fleet push --url"):
        fit_chunk_size(None, BrokerLimits(maximum_packet_size=600), CHUNK_TOPIC)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (("--target", "device:cam-1", "--waves", "10%,100%"), "stages a rollout over a group"),
        (("--target", "group:g", "--waves", "50%,10%,100%"), "reach further than the one before"),
        (("--target", "group:g", "--waves", "10%,50%"), "last wave must reach 100"),
        (("--target", "group:g", "--waves", "ten,100"), "are not percentages"),
        (("--target", "group:g", "--waves", "10%,100%", "--max-failures", "lots"), "not a count"),
        (("--target", "group:g", "--waves", "10%,100%", "--wave-interval", "soon"), "not a duration"),
        (("--target", "group:g", "--id", "x" * 201), "--id must be 1 to 200 characters"),
    ],
)
def test_a_bad_staged_push_is_refused_before_the_broker_is_contacted(
    capsys: pytest.CaptureFixture[str], bundles: dict[str, Path], extra: tuple[str, ...], words: str
) -> None:
    from agent.cli import main

    try:
        status = main(["fleet", "push", str(bundles["v1"]), *extra, "--broker", "mqtt://127.0.0.1:9"])
    except SystemExit as usage:  # argparse: a value its type refuses
        status = int(str(usage.code))
    assert status in (1, 2)
    error = capsys.readouterr().err
    assert words in error and "cannot reach the broker" not in error, error
