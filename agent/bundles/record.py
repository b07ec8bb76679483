"""The deployment record (`Deployment`, `State`, autotune's `Tuning` and `TuningRecord` in it).

The record is made into JSON for ``deployment.json`` by `Deployment.to_json` and read back by
`Deployment.from_json` (records written by older versions load too: missing fields take their
defaults, unknown ones are ignored); its error is an `ErrorInfo`, its tuning typed values.

The store writes it with `runtimes.files.atomic_write` (temp file, fsync, rename, fsync of the
folder), so a reader, or the agent after a power cut, sees the old or the new record, never a mix.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from enum import Enum

from pydantic import TypeAdapter

from agent.errors import BundleError, ErrorInfo
from agent.errors import ErrorCode as ErrorCode  # pydantic < 2.6 resolves ErrorInfo's annotations here
from runtimes.base import RuntimeName


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


@dataclass(frozen=True)
class Tuning:
    """Autotune's choice for a version: serve `artifact` on `runtime` / `provider` with
    `threads` per call and `workers` calls in flight; measured `fps` and `p95_ms`; why.
    Made by `agent.bundles.tuning.autotune`, kept by the store per version."""

    runtime: RuntimeName
    provider: str
    artifact: str
    precision: str
    threads: int | None
    workers: int
    fps: float | None
    p95_ms: float | None
    reason: str


@dataclass(frozen=True)
class ReportRow:
    """One measured way of running a version, as records and documents keep it (the fields of
    `pipelines.measure.matrix.Row`): latencies in ms per call (``{"p50", "p95"}``), `fps` with
    `workers` calls at once, `rss_mb` the peak resident memory of the measuring process,
    parity against the reference; `error` says why it could not run."""

    runtime: RuntimeName
    provider: str
    artifact: str
    precision: str
    workers: int
    threads: int | None
    latency_ms: dict[str, float] | None = None
    fps: float | None = None
    rss_mb: float | None = None
    energy_mj_per_frame: float | None = None
    parity: dict[str, float | None] | None = None
    error: str | None = None


@dataclass(frozen=True)
class TuningRecord:
    """Autotune at an activation: its `choice` (None: nothing qualified, the runtime policy
    decides) and every row it measured."""

    choice: Tuning | None
    rows: tuple[ReportRow, ...] = ()


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
    error: ErrorInfo | None = None
    from_sha: str | None = None
    previous_before: str | None = None
    attempt: int = 1  # the daemon retries a deployment once after a crash while verifying or installing
    probation_s: float = 0.0
    history: list[tuple[State, float]] = field(default_factory=list)
    tuning: TuningRecord | None = None  # autotune at activation: the choice and the measured rows

    def to(self, state: State, error: BundleError | None = None) -> None:
        """Enter `state` (recorded in the history); `error` becomes the record's code and message."""
        self.state = State(state)
        if error is not None:
            self.error = ErrorInfo.of(error)
        self.history.append((state, round(time.time(), 3)))

    @property
    def started(self) -> float | None:
        """When it entered its first state (Unix seconds)."""
        return self.history[0][1] if self.history else None

    def to_json(self) -> bytes:
        """The record as ``deployment.json`` holds it (history as ``[state, ts]`` pairs)."""
        return json.dumps(asdict(self), indent=2).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Deployment:
        """A record read back from ``deployment.json``; `ValueError` (pydantic's
        `ValidationError`, naming each bad field) when it is not one."""
        return _RECORD.validate_json(raw)


_RECORD = TypeAdapter(Deployment)
