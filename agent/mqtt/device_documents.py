"""The documents a device publishes about itself (docs/mqtt.md): ``status``, ``deployment`` and
``telemetry``, one pydantic model each, shared by both sides of the wire.

The device builds them from its snapshot and deployment record (agent/daemon/documents.py, the
only place they are made) and `to_bytes` makes them JSON. The operator's side reads them with
`read` (agent/fleet/state.py, the rollout watch, `fleet push --wait`), which never raises: a
retained payload that is not such a document (not JSON, junk from another client, a field of
the wrong kind such as ``{"progress": "half"}``) comes back as `Unreadable`, naming the topic and
what is wrong, and is shown as such.

Reading is tolerant where versions differ and strict where decisions rest: unknown keys are
ignored (a newer device may add some) and what older devices did not send has a default, but a
status needs its `state`, a deployment record its `id`, `sha256` and `state` (a `State`), and
an error is an `ErrorInfo` whose `code` is an `ErrorCode`. Numbers keep their units in their
names (ms, °C, W, MiB), times are Unix seconds. Every number read must be finite: a retained
``Infinity``, ``NaN`` or ``1e999`` (which the JSON parsers take) makes the document unreadable
rather than a table that crashes on it; the device's encoder writes a non-finite value as null.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_serializer,
    field_validator,
    model_serializer,
    model_validator,
)

# pydantic < 2.6 resolves a stdlib dataclass's annotations in the module of the model that holds
# it: the names the records below annotate with are imported here for it (hence the `as` forms)
from agent.bundles.record import CameraAgreementRecord as CameraAgreementRecord
from agent.bundles.record import CameraRateRecord as CameraRateRecord
from agent.bundles.record import ClassAgreementRecord as ClassAgreementRecord
from agent.bundles.record import ClassRateRecord as ClassRateRecord
from agent.bundles.record import QualityOutcome as QualityOutcome
from agent.bundles.record import QualityRecord, ShadowRecord, State, TuningRecord
from agent.bundles.record import ReportRow as ReportRow
from agent.bundles.record import ShadowOutcome as ShadowOutcome
from agent.bundles.record import Tuning as Tuning
from agent.errors import ErrorCode, ErrorInfo, validation_problems
from runtimes.base import RuntimeName as RuntimeName  # likewise, for TuningRecord

#: a device's lifecycle state as its status names it (the last will: ``offline``)
DeviceState = Literal["starting", "online", "stopping", "offline"]
#: a larger retained payload is not read
MAX_DOCUMENT_BYTES = 1 << 20

_D = TypeVar("_D", bound="DeviceDocument")


@dataclass(frozen=True)
class Unreadable:
    """A retained payload on a device's topic that is not the document the topic carries:
    `problem` says what is wrong (at most three problems, each on one line)."""

    topic: str
    problem: str

    def __str__(self) -> str:
        return f"{self.topic}: {self.problem}"


@dataclass(frozen=True)
class DownloadProgress:
    """A bundle download: chunks and bytes done of the total, chunks found on disk when it
    (re)started (`resumed`), fetched by this process, and received twice (`duplicates`)."""

    chunks_done: int
    chunks_total: int
    bytes_done: int
    bytes_total: int
    resumed: int
    fetched: int
    duplicates: int


class _Part(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, from_attributes=True, populate_by_name=True)


def _cameras_of_older_devices(data: Any) -> Any:
    """A status or telemetry document of a device before ``cameras`` (``pipelines`` only, the
    old name kept for one release): its cameras are its pipelines."""
    if isinstance(data, dict) and "cameras" not in data and "pipelines" in data:
        return {**data, "cameras": data["pipelines"]}
    return data


class DeviceDocument(_Part):
    """What the three documents share: one JSON form, one reader."""

    @model_validator(mode="before")
    @classmethod
    def _older_devices(cls, data: Any) -> Any:
        return _cameras_of_older_devices(data)

    #: fields left out of the JSON while they are None (absent, not ``null``)
    omitted_when_none: ClassVar[frozenset[str]] = frozenset()

    def to_bytes(self) -> bytes:
        """The document as compact JSON (the device's only encoder of it)."""
        omit = {name for name in self.omitted_when_none if getattr(self, name) is None}
        return self.model_dump_json(by_alias=True, exclude=omit or None).encode()

    @classmethod
    def read(cls: type[_D], payload: bytes | bytearray, topic: str) -> _D | Unreadable:
        """The document in a retained `payload`, or `Unreadable` saying why it is not one."""
        if len(payload) > MAX_DOCUMENT_BYTES:
            return Unreadable(topic, f"{len(payload)} bytes, more than {MAX_DOCUMENT_BYTES}")
        if (number := _not_finite(payload)) is not None:
            return Unreadable(topic, f"{number} is not a finite number")
        try:
            return cls.model_validate_json(payload)
        except ValidationError as exc:
            return Unreadable(topic, _problems(exc))


def _not_finite(payload: bytes | bytearray) -> str | None:
    """The first number in `payload` that is not finite, as written (None: every one is, or the
    payload is not JSON, which the model then says)."""
    found: list[str] = []

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            found.append(text)
        return value

    def constant(text: str) -> float:
        found.append(text)
        return 0.0

    try:
        json.loads(payload, parse_float=number, parse_constant=constant)
    except (ValueError, RecursionError):
        return None
    return found[0] if found else None


def _problems(exc: ValidationError, shown: int = 3) -> str:
    """What is wrong, on one line: fields of the wrong kind first, then missing ones; an enum's
    list of every allowed value is cut short."""
    found = [" ".join(problem.split()) for problem in validation_problems(exc)]
    problems = sorted(found, key=lambda problem: problem.endswith(": Field required"))  # stable: else in order
    problems = [p if len(p) <= 120 else p[:119] + "…" for p in problems]
    more = f" (and {len(problems) - shown} more)" if len(problems) > shown else ""
    return "; ".join(problems[:shown]) + more


# -- status ---------------------------------------------------------------------------------------


class BoardRef(_Part):
    kind: str
    model: str
    arch: str


class BundleRef(_Part):
    """An installed bundle version."""

    name: str
    version: str
    sha256: str


class GovernorBrief(_Part):
    level: str
    reason: str


class RolloutBrief(_Part):
    """The device in its group's staged rollout: its wave of `waves` (from 1), when it opens
    (the device's clock) and whether it waits, is open or is halted."""

    deployment: str
    wave: int
    waves: int
    opens_at: float
    state: Literal["waiting", "open", "halted"]


class RuntimeBrief(_Part):
    """A backend as probed at start: `crashed` names the signal when its library killed the probe."""

    available: bool
    version: str | None = None
    crashed: str | None = None
    reason: str | None = None


class EngineBrief(_Part):
    """The TensorRT engine build in progress or the last one (docs/tensorrt.md): `progress`
    0..1, `started` / `finished` Unix seconds, a failure's code and message."""

    bundle: str
    artifact: str
    precision: str
    state: Literal["building", "ready", "failed", "cancelled"]
    phase: str | None = None
    progress: float = 0.0
    started: float
    finished: float | None = None
    error_code: ErrorCode | None = None
    message: str | None = None
    note: str | None = None


class StatusDocument(DeviceDocument):
    """``<root>/<device>/status`` (retained): who the device is and what it serves. The last will
    is the minimal ``{"state": "offline", "device"}``; every other field then takes its default."""

    state: DeviceState
    ts: float | None = None
    device: str | None = None
    group: str | None = None
    agent_version: str | None = None
    protocol: int | None = Field(
        default=None, description="The newest control protocol the agent reads (absent: an agent before 0.2.0, 1)."
    )
    board: BoardRef | None = None
    bundle: BundleRef | None = None
    runtime: str | None = None
    cameras: tuple[str, ...] = ()
    pipelines: tuple[str, ...] = Field(default=(), description="Deprecated: the same as cameras, for one release.")
    fps: float | None = None
    temperature_c: float | None = None
    governor: GovernorBrief | None = None
    error: str | None = Field(default=None, description="Why the current version cannot be served.")
    deployment_problem: str | None = None
    warnings: tuple[str, ...] = ()
    rollout: RolloutBrief | None = None
    runtimes: dict[str, RuntimeBrief] = Field(default_factory=dict)
    engine: EngineBrief | None = None


# -- deployment -----------------------------------------------------------------------------------


class HistoryEntry(_Part):
    state: State
    ts: float


#: the classes a camera of a shadow or of probation's quality check carries in the document: the
#: ones with most detections (a model may have a thousand; the record on the device keeps them all)
MAX_CLASSES = 20
#: the characters of a shadow's or quality check's message the document carries
MAX_MESSAGE = 1000


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


def bounded_shadow(record: ShadowRecord | None) -> ShadowRecord | None:
    """The shadow's result as the document carries it: each camera's `MAX_CLASSES` classes with
    most detections of either version (in class order), the message cut at `MAX_MESSAGE`."""
    if record is None:
        return None
    cameras = tuple(replace(c, classes=_most(c.classes, lambda k: k.serving + k.candidate)) for c in record.cameras)
    return replace(record, message=_cut(record.message), cameras=cameras)


def bounded_quality(record: QualityRecord | None) -> QualityRecord | None:
    """Probation's quality result as the document carries it: each camera's `MAX_CLASSES`
    classes seen most often by either version (in class order), the message cut at `MAX_MESSAGE`,
    its `agreement` bounded as a shadow's."""
    if record is None:
        return None
    cameras = tuple(
        replace(c, classes=_most(c.classes, lambda k: k.before_per_min + k.after_per_min)) for c in record.cameras
    )
    return replace(record, message=_cut(record.message), cameras=cameras, agreement=bounded_shadow(record.agreement))


_C = TypeVar("_C", ClassAgreementRecord, ClassRateRecord)


def _most(classes: tuple[_C, ...], seen: Callable[[_C], float]) -> tuple[_C, ...]:
    if len(classes) <= MAX_CLASSES:
        return classes
    kept = sorted(classes, key=lambda k: (-seen(k), k.class_id))[:MAX_CLASSES]
    return tuple(sorted(kept, key=lambda k: k.class_id))


class DeploymentDocument(DeviceDocument):
    """``<root>/<device>/deployment`` (retained): the deployment record (agent/bundles/record.py)
    with the download's `progress` (absent when there was none), its shadow's result or, while it
    runs, its numbers so far (`shadow`), and probation's quality check (`quality`): at most
    `MAX_CLASSES` classes per camera."""

    id: str
    sha256: str
    state: State
    name: str | None = None
    version: str | None = None
    error: ErrorInfo | None = None
    from_sha: str | None = None
    previous_before: str | None = None
    attempt: int = 1
    probation_s: float = 0.0
    history: tuple[HistoryEntry, ...] = ()
    tuning: TuningRecord | None = None
    progress: DownloadProgress | None = None
    shadow: ShadowRecord | None = None
    quality: QualityRecord | None = None
    kind: Literal["agent"] | None = None  # an agent bundle's deployment (absent: a model bundle's)

    omitted_when_none: ClassVar[frozenset[str]] = frozenset({"progress", "shadow", "quality", "kind"})


# -- telemetry ------------------------------------------------------------------------------------


class LatencyBrief(_Part):
    p50: float
    p95: float


class SourceBrief(_Part):
    """A camera's capture side: its state, last failure, reconnects, a pipe source's last stderr lines."""

    state: str
    error: str | None = None
    reconnects: int = 0
    output: tuple[str, ...] = ()


class GateBrief(_Part):
    """A camera's motion gate (docs/cameras.md "Motion"): the share of frames inferred and the
    share with motion since its pipeline started, 0..1; its idle interval (s) and keepalive
    (FPS) in force, agent.yaml's stretched by the governor's slowdown (docs/telemetry.md)."""

    inferred_ratio: float
    motion_ratio: float
    idle_interval_s: float | None = None
    keepalive_fps: float | None = None


class HealthBrief(_Part):
    """A camera's health check (docs/cameras.md "Camera health"): the kinds of its `problems` now
    (empty: healthy), the newest frame's mean `luminance` and its spread (`contrast`), grey
    levels, its `sharpness` (normalised Laplacian variance), and its `shift_px` (pixels of the
    grey copy) and `rotation_deg` against the reference image."""

    problems: list[str] = Field(default_factory=list)
    luminance: float
    contrast: float
    sharpness: float
    shift_px: float = 0.0
    rotation_deg: float = 0.0

    @field_validator("problems", mode="before")
    @classmethod
    def _kinds(cls, value: Any) -> Any:
        """From a camera's `HealthState`, its problems' kinds."""
        if isinstance(value, tuple | list):
            return [getattr(item, "kind", item) for item in value]
        return value


class CameraTelemetry(_Part):
    """One camera: fps now and its cap, counters since start, latency per stage (ms), the
    newest frame's objects by label (`in_view`); with a motion gate, the frames inferred of
    `frames` (`inferred`) and the gate's ratios (`gate`), both absent without one; with a health
    check, its newest state (`health`), absent without one."""

    name: str
    fps: float
    max_fps: float | None = None
    frames: int = 0
    dropped: int = 0
    errors: int = 0
    paused: bool = False
    latency_ms: dict[str, LatencyBrief] = Field(default_factory=dict)
    source_status: SourceBrief | None = None
    shared_by: int = 1
    mean_batch: float = 1.0
    in_view: dict[str, int] = Field(default_factory=dict)
    inferred: int | None = None
    gate: GateBrief | None = None
    # drift (issue 40): the camera's drift score 0..1 (pipelines.drift), absent until it has one
    drift: float | None = Field(default=None, ge=0, le=1)
    health: HealthBrief | None = None  # absent while the camera's health check is off (or has judged nothing)

    @model_serializer(mode="wrap")
    def _optional_when_set(self, handler: SerializerFunctionWrapHandler) -> Any:
        """The motion gate's, drift's and health's keys only on a camera that has them."""
        return _without_unset(handler(self), self, "inferred", "gate", "drift", "health")


class SystemTelemetry(_Part):
    cpu_percent: float
    memory_percent: float
    memory_available_mb: float
    process_cpu_percent: float
    process_rss_mb: float
    disk_free_mb: float | None = None
    disk_total_mb: float | None = None
    clock_synchronised: bool | None = None


class RailTelemetry(_Part):
    voltage_v: float | None = None
    current_a: float | None = None
    power_w: float | None = None


class BatteryTelemetry(_Part):
    percent: float | None = None
    status: str | None = None
    voltage_v: float | None = None
    current_a: float | None = None
    power_w: float | None = None


class ThrottledTelemetry(_Part):
    under_voltage: bool
    arm_frequency_capped: bool
    throttled: bool
    soft_temp_limit: bool
    under_voltage_since_boot: bool
    arm_frequency_capped_since_boot: bool
    throttled_since_boot: bool
    soft_temp_limit_since_boot: bool


class FanTelemetry(_Part):
    duty_percent: float | None = None
    rpm: float | None = None


class GpuTelemetry(_Part):
    name: str
    load_percent: float | None = None
    temp_c: float | None = None
    memory_used_mb: float | None = None
    memory_total_mb: float | None = None
    power_w: float | None = None
    freq_mhz: float | None = None


class SensorsTelemetry(_Part):
    """Every sensor (docs/telemetry.md): the hottest `temp_c`, each zone's, the board's input
    power and what measured it, rails by name, battery, Pi throttle flags, fan, GPU."""

    temp_c: float | None = None
    thermal_zones: dict[str, float | None] = Field(default_factory=dict)
    power_w: float | None = None
    power_source: str | None = None
    rails: dict[str, RailTelemetry] = Field(default_factory=dict)
    battery: BatteryTelemetry | None = None
    throttled: ThrottledTelemetry | None = None
    fan: FanTelemetry | None = None
    gpu: GpuTelemetry | None = None
    sources: tuple[str, ...] = ()


class ActionsTelemetry(_Part):
    fps_cap: float | None = None
    gate_slowdown: float = 1.0
    gated_fps_cap: float | None = None
    paused: bool = False
    fan: float | None = None
    artifact: str = "default"
    stopped: bool = False


class ThresholdsTelemetry(_Part):
    warm: float
    hot: float
    critical: float


class GovernorTelemetry(_Part):
    """The governor's level (and each axis), why, since when, the actions in force."""

    level: str
    thermal: str
    battery: str
    reason: str
    since: float
    actions: ActionsTelemetry = ActionsTelemetry()
    thresholds_c: ThresholdsTelemetry | None = None
    fan_error: str | None = None


class MqttTelemetry(_Part):
    queued: int
    dropped: int
    reconnects: int


class OutboxDropped(_Part):
    """Messages the outbox let go of since its file was made: by kind, and by why."""

    telemetry: int = 0
    event: int = 0
    deployment: int = 0
    full: int = 0
    expired: int = 0
    unwritten: int = 0
    too_big: int = 0
    refused: int = 0


class OutboxTelemetry(_Part):
    """The durable outbox (docs/mqtt.md#delivery): `messages` waiting, the file's `bytes`, the
    oldest waiting message's age (s), `dropped`, `since` (Unix s) the file counts, `last_seq`,
    `recreated`: the times the file was deleted or replaced under the running agent and made again."""

    messages: int = 0
    bytes: int = 0
    oldest_age_s: float | None = None
    dropped: OutboxDropped = OutboxDropped()
    since: float | None = None
    last_seq: int = 0
    problem: str | None = None
    recreated: int = 0


class EventTelemetry(_Part):
    published: int = 0
    suppressed: int = 0
    classified: int = 0  # the second stage's crops classified
    classify_dropped: int = 0  # and dropped, its queue full

    @model_serializer(mode="wrap")
    def _stage_when_used(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The second stage's counts only once it ran: a device without one publishes what it
        published before them."""
        data: dict[str, Any] = handler(self)
        if not self.classified and not self.classify_dropped:
            data.pop("classified", None)
            data.pop("classify_dropped", None)
        return data


class LineCount(_Part):
    in_: int = Field(alias="in")
    out: int


class ZoneCount(_Part):
    now: int
    total: int


def _without_unset(document: Any, model: BaseModel, *keys: str) -> Any:
    """`document` (a model serialized) without each of `keys` whose value in the model is None:
    a field added after the documents were typed is left off the wire until it has a value, so
    what a device sent before stays byte for byte the same (tests/data/documents)."""
    if isinstance(document, dict):
        for key in keys:
            if getattr(model, key) is None:
                document.pop(key, None)
    return document


class AnalyticsTelemetry(_Part):
    """The line and zone totals; `since` (Unix seconds) is when they started counting: they go
    on across restarts until a ``reset-counts`` (docs/analytics.md)."""

    lines: dict[str, LineCount] = Field(default_factory=dict)
    zones: dict[str, ZoneCount] = Field(default_factory=dict)
    since: float | None = None

    @model_serializer(mode="wrap")
    def _since_when_known(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_unset(handler(self), self, "since")


class TelemetryDocument(DeviceDocument):
    """``<root>/<device>/telemetry`` (not retained), every ``telemetry.interval_s``. `system` is
    ``{}`` on the wire until the first sample (None here). `energy_wh` is the board's input
    energy since the agent started and `energy_wh_per_h` that over the hours measured (absent
    where the power is not measured, docs/telemetry.md)."""

    ts: float
    device: str
    agent_version: str | None = Field(default=None, description="The agent's version (absent before 0.2.0).")
    fps: float | None = None
    dropped: int = 0
    cameras: tuple[CameraTelemetry, ...] = ()
    pipelines: tuple[CameraTelemetry, ...] = Field(
        default=(), description="Deprecated: the same as cameras, for one release."
    )
    system: SystemTelemetry | None = None
    sensors: SensorsTelemetry = SensorsTelemetry()
    energy_mj_per_frame: float | None = None
    energy_wh: float | None = None
    energy_wh_per_h: float | None = None
    governor: GovernorTelemetry | None = None
    mqtt: MqttTelemetry | None = None
    outbox: OutboxTelemetry | None = None
    events: EventTelemetry = EventTelemetry()
    analytics: AnalyticsTelemetry = AnalyticsTelemetry()

    @field_validator("system", mode="before")
    @classmethod
    def _no_sample_yet(cls, value: Any) -> Any:
        return None if value == {} else value

    @model_serializer(mode="wrap")
    def _outbox_when_kept(self, handler: SerializerFunctionWrapHandler) -> Any:
        """A device without an outbox (no broker) sends no ``outbox`` key, as before it had one;
        one whose power is not measured no ``energy_wh`` and ``energy_wh_per_h``."""
        return _without_unset(handler(self), self, "outbox", "energy_wh", "energy_wh_per_h")

    @field_serializer("system", mode="wrap")
    def _empty_without_sample(self, value: SystemTelemetry | None, handler: SerializerFunctionWrapHandler) -> Any:
        return {} if value is None else handler(value)
