"""Staged rollouts: the schedule a group's desired document carries, and each device's wave.

Wave `i` (counted from 0) opens at ``start + i * interval_s`` (Unix seconds) and takes the
devices whose `position` - a stable hash of (deployment id, device id) onto [0, 100) - is below
``waves[i]`` percent and not in an earlier wave, so wave shares are shares of the group on
average, whatever its size, and every deployment picks other canaries. No process has to stay
up for a rollout to proceed: each device computes its wave and starts when it opens, by its own
clock.

The operator's watch (agent/fleet/rollout_watch.py) halts a rollout when failures among the devices
that started exceed `max_failures`: it signs the same desired document again with `halted`
set (a newer `issued_at`, so the device's gate keeps its order per topic); devices that have not
started then do not start, and with ``on_halt: rollback`` those that took it roll back. Resuming
clears `halted` and moves `start` on by the time the rollout stood still, so the waves that were
open stay open and the next one opens when it had still to wait.

Pure values and functions (pydantic models, frozen, unknown keys forbidden): no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

OnHalt = Literal["keep", "rollback"]
MAX_WAVES = 20


class _Value(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # a start of Infinity refused


def position(deployment_id: str, device: str) -> float:
    """Where `device` falls in `deployment_id`'s rollout: a stable value in [0, 100)."""
    digest = hashlib.sha256(f"{deployment_id}\n{device}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * 100


class FailureLimit(_Value):
    """How many failed devices a rollout tolerates: a count (`devices`) or a share of the
    devices that started (`percent`); one of the two."""

    devices: int | None = Field(default=None, ge=0, le=1_000_000, description="Failed devices tolerated.")
    percent: float | None = Field(default=None, ge=0, le=100, description="Failed share of started devices tolerated.")

    @model_validator(mode="after")
    def _one(self) -> FailureLimit:
        if (self.devices is None) == (self.percent is None):
            raise ValueError("give max_failures as devices or as percent, not both or neither")
        return self

    @classmethod
    def parse(cls, text: str) -> FailureLimit:
        """``5%`` or ``3``; `ValueError` naming the text otherwise."""
        value = text.strip()
        try:
            if value.endswith("%"):
                return cls(percent=float(value[:-1]))
            return cls(devices=int(value))
        except ValueError as exc:
            raise ValueError(f"max failures {text!r} is not a count (3) or a percentage from 0 to 100 (5%)") from exc

    def exceeded(self, failed: int, started: int) -> bool:
        """Whether `failed` devices among `started` are past the limit."""
        if self.devices is not None:
            return failed > self.devices
        assert self.percent is not None  # the validator wants one of the two
        return failed > self.percent / 100 * started

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else f"{self.devices} device(s)"


class Halt(_Value):
    """When and why a rollout was halted."""

    at: float = Field(ge=0, description="When the operator (or the watch) halted it, Unix seconds.")
    reason: str = Field(default="", max_length=300, description="Why, in words.")


def parse_waves(text: str) -> list[float]:
    """``1%,10%,50%,100%`` (the ``%`` may be left out) into percentages; `ValueError` otherwise."""
    try:
        return [float(part.strip().removesuffix("%")) for part in text.split(",")]
    except ValueError as exc:
        raise ValueError(f"waves {text!r} are not percentages such as 1%,10%,50%,100%") from exc


class Rollout(_Value):
    """The schedule of a group's deployment (see the module docstring)."""

    waves: list[float] = Field(
        min_length=1, max_length=MAX_WAVES, description="Cumulative share of the group per wave, percent; ends at 100."
    )
    start: float = Field(ge=0, description="When the first wave opens, Unix seconds.")
    interval_s: float = Field(ge=0, le=30 * 86400, description="Seconds between two waves opening.")
    max_failures: FailureLimit = Field(description="Failures among started devices that halt the rollout.")
    on_halt: OnHalt = Field(default="keep", description="keep: started devices keep it; rollback: they roll back.")
    halted: Halt | None = Field(default=None, description="Set while the rollout is halted.")

    @model_validator(mode="after")
    def _increasing(self) -> Rollout:
        waves = self.waves
        if any(not 0 < w <= 100 for w in waves):
            raise ValueError(f"waves {waves}: every wave must be a share above 0 and at most 100 percent")
        if any(b <= a for a, b in itertools.pairwise(waves)):
            raise ValueError(f"waves {waves}: each wave must reach further than the one before")
        if waves[-1] != 100:
            raise ValueError(f"waves {waves}: the last wave must reach 100 percent of the group")
        return self

    def wave_of(self, deployment_id: str, device: str) -> int:
        """The wave (from 0) `device` belongs to in deployment `deployment_id`."""
        where = position(deployment_id, device)
        return next(i for i, share in enumerate(self.waves) if where < share)

    def opens_at(self, wave: int) -> float:
        """When wave `wave` opens (Unix seconds), halts aside."""
        return self.start + wave * self.interval_s

    def opened(self, now: float) -> int:
        """How many waves have opened by `now` (halts aside): 0 before the start."""
        if now < self.start:
            return 0
        if self.interval_s == 0:
            return len(self.waves)
        return min(len(self.waves), int((now - self.start) // self.interval_s) + 1)

    def may_start(self, wave: int, now: float) -> bool:
        """Whether a device of wave `wave` that has not started may start at `now`."""
        return self.halted is None and now >= self.opens_at(wave)

    def halt(self, now: float, reason: str) -> Rollout:
        """This schedule, halted at `now`."""
        return self.model_copy(update={"halted": Halt(at=now, reason=reason[:300])})

    def resume(self, now: float) -> Rollout:
        """This schedule running again: every wave opens as much later as it stood halted."""
        if self.halted is None:
            return self
        paused = max(0.0, now - self.halted.at)
        return self.model_copy(update={"halted": None, "start": self.start + paused})
