"""The deployment record (`Deployment`, `State`) and the durable writes the store is built on.

Every file the agent keeps is replaced through `atomic_write` (temp file, fsync, rename, fsync of
the folder; it lives in `runtimes.base`, which the engine cache shares, and is re-exported here),
so a reader, or the agent after a power cut, sees the old or the new content, never a mix.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from agent.errors import BundleError

# re-exported: one implementation, shared with the engine cache (runtimes cannot import agent)
from runtimes.base import atomic_write as atomic_write
from runtimes.base import fsync_dir as fsync_dir


class State(str, Enum):
    """The states of a deployment, in the order a successful one passes them (docs/bundles.md,
    docs/mqtt.md). A `str`, so it compares to and serialises as its name."""

    QUEUED = "QUEUED"
    DOWNLOADING = "DOWNLOADING"
    VERIFYING = "VERIFYING"
    INSTALLING = "INSTALLING"
    ACTIVATING = "ACTIVATING"
    PROBATION = "PROBATION"
    SUCCEEDED = "SUCCEEDED"
    REJECTED = "REJECTED"
    FAILED = "FAILED"
    ROLLED_BACK = "ROLLED_BACK"

    def __str__(self) -> str:
        return self.value


#: a deployment in one of these has ended: nothing more happens to it (FAILED ends a deployment
#: that never switched, e.g. DOWNLOAD_TIMEOUT; one that switched goes on to ROLLED_BACK)
FINAL_STATES = frozenset({State.SUCCEEDED, State.REJECTED, State.FAILED, State.ROLLED_BACK})
#: a deployment in one of these touched no version: the daemon resumes it after a restart
RESUMABLE_STATES = frozenset({State.QUEUED, State.DOWNLOADING})


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder` (after an unpack, before the rename)."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(root) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


@dataclass
class Deployment:
    """One attempt to install and activate a bundle (or a rollback).

    `from_sha` and `previous_before` are the pointers when it started: what recovery restores.
    `probation_s` > 0 means the version is watched after it switched (a crash then rolls back).
    """

    id: str
    sha256: str
    state: State = State.QUEUED
    name: str | None = None
    version: str | None = None
    error: dict[str, str] | None = None
    from_sha: str | None = None
    previous_before: str | None = None
    attempt: int = 1  # the daemon retries a deployment once after a crash while verifying or installing
    probation_s: float = 0.0
    history: list[tuple[State, float]] = field(default_factory=list)
    tuning: dict[str, Any] | None = None  # autotune at activation: the choice and the measured rows

    def to(self, state: State, error: BundleError | None = None) -> None:
        """Enter `state` (recorded in the history); `error` becomes the record's code and message."""
        self.state = State(state)
        if error is not None:
            self.error = {"code": error.code, "message": error.message}
        self.history.append((state, round(time.time(), 3)))

    @property
    def started(self) -> float | None:
        """When it entered its first state (Unix seconds)."""
        return self.history[0][1] if self.history else None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Deployment:
        """A record read back from ``deployment.json``; `TypeError` / `ValueError` if malformed."""
        raw = dict(raw)
        raw["state"] = State(raw.get("state", State.QUEUED))
        raw["history"] = [(State(state), float(ts)) for state, ts in raw.get("history", [])]
        return cls(**raw)
