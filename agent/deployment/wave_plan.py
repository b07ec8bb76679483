"""The device's part in a staged rollout: whether to start, wait, hold or roll back.

`plan` is pure: from the desired document the device follows, what it followed last, its last
deployment record, the version it serves and the time (Unix seconds, by the device's clock) it
decides what the deployer does next. `undo_halted` carries out ``on_halt: rollback`` on the
store for a deployment that had already ended SUCCEEDED or was still waiting to download. Both
run in the deployer's thread. The schedule itself is `agent.mqtt.rollout_schedule.Rollout`.

- no rollout: start a document not acted on yet (the behaviour without waves);
- a rollout: start when the device's wave is open and the rollout is not halted; a device rolled
  back or stopped by a halt (``ROLLOUT_HALTED``) takes the deployment again once it is resumed;
- halted with ``on_halt: rollback``: a device that took the deployment rolls it back, one whose
  download was interrupted (a restart) ends it; with ``keep`` they keep it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from agent.bundles.record import RESUMABLE_STATES, Deployment, State
from agent.bundles.store import Store
from agent.errors import BundleError, ErrorCode
from agent.mqtt.protocol import Desired
from agent.snapshot import RolloutPosition


class Action(str, Enum):
    START = "start"  # deploy it (or resume the download)
    WAIT = "wait"  # its wave opens later
    HOLD = "hold"  # halted before this device started
    UNDO = "undo"  # halted with on_halt rollback: roll back what it did
    NOTHING = "nothing"  # acted on already


@dataclass(frozen=True)
class Plan:
    """What to do with a desired document now; `position` is the device in its rollout (None
    without one); `wake_at` is when to look again (Unix seconds) while waiting."""

    action: Action
    position: RolloutPosition | None = None
    wake_at: float | None = None


def halted_by_rollout(record: Deployment | None, deployment_id: str) -> bool:
    """Whether `record` is `deployment_id` ended (or rolled back) by a rollout's halt."""
    if record is None or record.id != deployment_id:
        return False
    return record.error is not None and record.error.code == ErrorCode.ROLLOUT_HALTED


def plan(
    *,
    desired: Desired,
    device: str,
    followed_id: str | None,
    last: Deployment | None,
    current_sha: str | None,
    now: float,
) -> Plan:
    """What the deployer does with `desired` at `now` (see the module docstring)."""
    rollout = desired.rollout
    if rollout is None:
        return Plan(Action.START if desired.id != followed_id else Action.NOTHING)
    wave = rollout.wave_of(desired.id, device)
    opens_at = rollout.opens_at(wave)
    started = last is not None and last.id == desired.id
    undone = halted_by_rollout(last, desired.id)
    state = "halted" if rollout.halted is not None else "open" if now >= opens_at else "waiting"
    position = RolloutPosition(desired.id, wave + 1, len(rollout.waves), opens_at, state)
    if rollout.halted is not None:
        if not started or undone:
            return Plan(Action.HOLD, position)
        assert last is not None
        took_it = last.state in RESUMABLE_STATES or (last.state == State.SUCCEEDED and current_sha == desired.sha256)
        if rollout.on_halt == "rollback" and took_it:
            return Plan(Action.UNDO, position)
    elif not started and now < opens_at:
        return Plan(Action.WAIT, position, wake_at=opens_at)
    elif undone:
        return Plan(Action.START, position)  # resumed: take it again
    return Plan(Action.START if desired.id != followed_id else Action.NOTHING, position)


def undo_halted(store: Store, record: Deployment, reason: str) -> Deployment:
    """``on_halt: rollback`` for `record`: a SUCCEEDED deployment has the pointers put back as
    they were before it (ROLLED_BACK; a device's first version leaves nothing serving, as a failed
    probation does), one still waiting to download ends REJECTED; both with ``ROLLOUT_HALTED``."""
    why = reason or "no reason given"
    error = BundleError(ErrorCode.ROLLOUT_HALTED, f"the rollout of {record.id} was halted: {why}")
    if record.state in RESUMABLE_STATES:
        record = record.to(State.REJECTED, error)
    else:
        store.undo_switch(record)
        record = record.to(State.ROLLED_BACK, error)
    store.record(record)
    return record
