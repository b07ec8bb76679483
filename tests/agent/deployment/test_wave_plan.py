"""`agent.deployment.wave_plan`: the device's part in a staged rollout, and undoing a halted one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from testkit.rollouts import HOUR, schedule
from testkit.store import A, B, two_versions, walked_to

from agent.bundles.record import Deployment, State
from agent.deployment.wave_plan import Action, plan, undo_halted
from agent.errors import BundleError, ErrorCode
from agent.mqtt.protocol import Desired
from agent.mqtt.rollout_schedule import Rollout


def record(state: State, deployment_id: str = "d1", code: ErrorCode | None = None, sha: str = B) -> Deployment:
    return walked_to(
        Deployment(id=deployment_id, sha256=sha, from_sha=A), state, BundleError(code, "why") if code else None
    )


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
    result = plan(desired=desired, device=device, followed_id=followed, last=last, current_sha=current, now=now)
    assert result.action == action
    assert result.position is not None and result.position.wave == wave + 1 and result.position.waves == 3
    assert (result.wake_at is not None) == (action == Action.WAIT)
    without = plan(
        desired=desired.model_copy(update={"rollout": None}),
        device=device,
        followed_id=followed,
        last=last,
        current_sha=current,
        now=now,
    )
    assert without.position is None and without.action == (Action.NOTHING if followed == "d1" else Action.START)


def test_undo_puts_the_pointers_back_or_ends_a_download(tmp_path: Path) -> None:
    store = two_versions(tmp_path)  # B serving, A before it
    taken = Deployment(id="d1", sha256=B, from_sha=A, previous_before=None).to(State.SUCCEEDED)
    undone = undo_halted(store, taken, "3 of 10 failed")
    assert (undone.state, undone.error and undone.error.code) == (State.ROLLED_BACK, "ROLLOUT_HALTED")
    assert undone.error is not None and "3 of 10 failed" in undone.error.message
    assert store.current_sha() == A and store.info(B) is None, "the version it brought is gone"
    assert store.last_deployment() == undone
    waiting = Deployment(id="d2", sha256=B, from_sha=A).to(State.DOWNLOADING)
    assert undo_halted(store, waiting, "").state == State.REJECTED and store.current_sha() == A
