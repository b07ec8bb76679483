"""The deployment record (`Deployment`, `State`, autotune's `Tuning` and `TuningRecord` in it).

A `Deployment` is a frozen value: `Deployment.to` returns the record in its next state, and
refuses (`IllegalTransition`) a step that `TRANSITIONS`, the table of the life cycle, does not
allow. Whoever moves a record keeps the value it returns (the deployer, the installer, the
store's recovery, a rollback, a halted rollout's undo).

The record is made into JSON for ``deployment.json`` by `Deployment.to_json` and read back by
`Deployment.from_json` (records written by older versions load too: missing fields take their
defaults, unknown ones are ignored); its error is an `ErrorInfo`, its tuning typed values.

The store writes it with `runtimes.files.atomic_write` (temp file, fsync, rename, fsync of the
folder), so a reader, or the agent after a power cut, sees the old or the new record, never a mix.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from pydantic import TypeAdapter

from agent.errors import BundleError, ErrorInfo
from agent.errors import ErrorCode as ErrorCode  # pydantic < 2.6 resolves ErrorInfo's annotations here
from runtimes.base import RuntimeName

if TYPE_CHECKING:
    from pipelines.measure.comparison import AgreementReport


class State(str, Enum):
    """The states of a deployment, in the order a successful one passes them (docs/bundles.md,
    docs/mqtt.md). A `str`, so it compares to and serialises as its name."""

    QUEUED = "QUEUED"
    DOWNLOADING = "DOWNLOADING"
    VERIFYING = "VERIFYING"
    INSTALLING = "INSTALLING"
    ACTIVATING = "ACTIVATING"
    SHADOW = "SHADOW"
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

#: the states a record may enter from each state; `Deployment.to` refuses any other. A new
#: record is QUEUED with no history, and its first step enters QUEUED (the deployer took a
#: desired document), VERIFYING (`edge-agent install` of a file), SUCCEEDED (the version is
#: already current) or ROLLED_BACK (a rollback's own record); a queued one may also end REJECTED
#: before its first chunk (too large, replaced, a rollback, a halt) or FAILED (no index in time).
#: QUEUED and DOWNLOADING may be entered again: a deployment resumed after a restart.
TRANSITIONS: Mapping[State, frozenset[State]] = MappingProxyType(
    {
        State.QUEUED: frozenset(
            {
                State.QUEUED,
                State.DOWNLOADING,
                State.VERIFYING,
                State.SUCCEEDED,
                State.REJECTED,
                State.FAILED,
                State.ROLLED_BACK,
            }
        ),
        State.DOWNLOADING: frozenset({State.DOWNLOADING, State.VERIFYING, State.REJECTED, State.FAILED}),
        State.VERIFYING: frozenset({State.INSTALLING, State.REJECTED}),
        State.INSTALLING: frozenset({State.ACTIVATING, State.REJECTED}),
        # SUCCEEDED also where recovery finds it switched but unrecorded; FAILED, then ROLLED_BACK
        State.ACTIVATING: frozenset({State.SHADOW, State.PROBATION, State.SUCCEEDED, State.FAILED}),
        # the candidate loaded beside the serving version, nothing switched yet: it switches
        # (PROBATION, SUCCEEDED) or ends REJECTED (SHADOW_DISAGREES, a rollback, a halt, a stop)
        State.SHADOW: frozenset({State.PROBATION, State.SUCCEEDED, State.REJECTED}),
        State.PROBATION: frozenset({State.SUCCEEDED, State.FAILED}),
        State.SUCCEEDED: frozenset({State.ROLLED_BACK}),  # undone by a rollout halted with on_halt: rollback
        State.REJECTED: frozenset(),
        State.FAILED: frozenset({State.ROLLED_BACK}),  # one that switched is rolled back in the same record
        State.ROLLED_BACK: frozenset(),
    }
)


class IllegalTransition(ValueError):
    """A step `TRANSITIONS` does not allow: a bug in the caller, never a bundle's fault."""

    def __init__(self, record: Deployment, state: State) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[record.state])) or "none: it has ended"
        super().__init__(f"deployment {record.id} cannot go from {record.state} to {state} (allowed: {allowed})")


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


@dataclass(frozen=True)
class ClassAgreementRecord:
    """One class in a shadow: detections of the serving version and the candidate, matched
    pairs, their F1 (`agreement`) and the candidate's confident detections over the serving
    version's (None where the serving version had none)."""

    class_id: int
    label: str | None
    serving: int
    candidate: int
    matched: int
    agreement: float
    confident_ratio: float | None


@dataclass(frozen=True)
class CameraAgreementRecord:
    """One camera in a shadow (`pipelines.measure.comparison.AgreementReport` as the record keeps
    it): frames compared, totals, precision and recall of the candidate against the serving
    version, their F1, the confident ratio, the task's measure (None for boxes), the median
    latency per frame of each in ms, the classes either found, and where both versions have a
    second stage the crops both classified and the share named alike (`top1`, else None)."""

    camera: str
    frames: int
    serving: int
    candidate: int
    matched: int
    precision: float
    recall: float
    agreement: float
    confident_ratio: float | None = None
    task: str | None = None
    task_score: float | None = None
    serving_ms: float | None = None
    candidate_ms: float | None = None
    classes: tuple[ClassAgreementRecord, ...] = ()
    crops: int = 0
    top1: float | None = None

    @classmethod
    def of(
        cls, camera: str, report: AgreementReport, label: Callable[[int], str | None] = lambda _: None
    ) -> CameraAgreementRecord:
        """One camera's `AgreementReport` as the record keeps it (rounded), `label` naming a
        class id: the one conversion of the shadow's record (`agent.deployment.quality`) and
        of ``edge-agent bench --against --json``, so the two give the same numbers."""
        return cls(
            camera=camera,
            frames=report.frames,
            serving=report.serving,
            candidate=report.candidate,
            matched=report.matched,
            precision=round(report.precision, 4),
            recall=round(report.recall, 4),
            agreement=round(report.agreement, 4),
            confident_ratio=_rounded(report.confident_ratio),
            task=report.task,
            task_score=_rounded(report.task_score),
            serving_ms=_rounded(report.serving_ms, 2),
            candidate_ms=_rounded(report.candidate_ms, 2),
            crops=report.crops,
            top1=_rounded(report.top1),
            classes=tuple(
                ClassAgreementRecord(
                    c.class_id,
                    label(c.class_id),
                    c.serving,
                    c.candidate,
                    c.matched,
                    round(c.agreement, 4),
                    _rounded(c.confident_ratio),
                )
                for c in report.classes
            ),
        )


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


ShadowOutcome = Literal["running", "agrees", "disagrees", "quiet"]  # running: progress, published only


@dataclass(frozen=True)
class ShadowRecord:
    """The shadow's result: `outcome` (the cameras judged agree, one disagrees, or too few
    detections to judge), the `mode` it ran in (``gate`` rejects on disagreement, ``report``
    goes on), the threshold, how long it ran (s), each camera, and a sentence saying why."""

    outcome: ShadowOutcome
    mode: Literal["gate", "report"]
    min_agreement: float
    seconds: float
    message: str
    cameras: tuple[CameraAgreementRecord, ...] = ()


@dataclass(frozen=True)
class ClassRateRecord:
    """One class on probation: confident detections per minute and their mean confidence under
    the previous version (just before the swap) and the new one, and `ratio` (new / previous,
    per frame; None when the previous version saw none)."""

    class_id: int
    label: str | None
    before_per_min: float
    after_per_min: float
    before_confidence: float
    after_confidence: float
    ratio: float | None


@dataclass(frozen=True)
class CameraRateRecord:
    """One camera on probation: frames and confident detections per frame under each version,
    their ratio (None: not judged, the previous version saw too little), and its classes."""

    camera: str
    before_frames: int
    after_frames: int
    before_per_frame: float
    after_per_frame: float
    ratio: float | None
    classes: tuple[ClassRateRecord, ...] = ()


QualityOutcome = Literal["kept", "blind", "quiet"]


@dataclass(frozen=True)
class QualityRecord:
    """What probation's quality check found: ``kept`` (the new version sees what the previous
    one saw), ``blind`` (it does not: PROBATION_BLIND) or ``quiet`` (too little seen before the
    swap to judge), the signed fraction it held the new version to, each camera, and why.
    `agreement`: the new version against the previous one on the same frames during probation
    (asked by ``min_agreement``; its ``candidate`` is the new version), None when not compared."""

    outcome: QualityOutcome
    min_ratio: float
    message: str
    cameras: tuple[CameraRateRecord, ...] = ()
    agreement: ShadowRecord | None = None


@dataclass(frozen=True)
class Deployment:
    """One attempt to install and activate a bundle (or a rollback), as a value: `to` gives the
    record in its next state.

    `from_sha` and `previous_before` are the pointers when it started: what recovery restores.
    `probation_s` > 0 means the version is watched after it switched (a crash then rolls back).
    `history` is each state entered with its time (Unix seconds), oldest first.
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
    history: tuple[tuple[State, float], ...] = ()
    tuning: TuningRecord | None = None  # autotune at activation: the choice and the measured rows
    shadow: ShadowRecord | None = None  # the candidate judged on live frames before the switch
    quality: QualityRecord | None = None  # what the new version saw on probation against the previous
    kind: Literal["model", "agent"] = "model"  # an agent bundle's: edge-agent itself (its switch.json decides)

    def to(self, state: State, error: BundleError | None = None) -> Deployment:
        """The record in `state` (added to the history); `error` becomes its code and message.
        Raises `IllegalTransition` when `TRANSITIONS` does not lead from this state to `state`."""
        state = State(state)
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(self, state)
        return replace(
            self,
            state=state,
            error=ErrorInfo.of(error) if error is not None else self.error,
            history=(*self.history, (state, round(time.time(), 3))),
        )

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
