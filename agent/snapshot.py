"""The running agent at one moment: `AgentSnapshot`, a typed, read-only value.

The daemon produces it (`agent.daemon.agent.Agent.snapshot`, callable from any thread, with or
without a broker); the MQTT status and telemetry documents and the status page are made from
it, and `to_json` is the one place it becomes a dict. Every field is a frozen value: numbers
keep their units in their names (`fps`, `latency_ms`, `process_rss_mb`), times are Unix
seconds (`ts`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agent.bundles.record import QualityRecord, ShadowRecord, State
from agent.bundles.store import VersionInfo
from agent.errors import ErrorInfo
from agent.governor.levels import Decision
from agent.hardware.board import Board
from agent.hardware.energy import Energy
from agent.hardware.readings import SensorReadings
from agent.hardware.system import SystemReadings
from agent.mqtt.device_documents import DownloadProgress
from agent.mqtt.link import LinkStats
from agent.mqtt.outbox import OutboxStats
from pipelines.drift import CameraDrift
from pipelines.pipeline import PipelineStats
from pipelines.tracking.analytics import CameraCounts
from pipelines.worker import LoopState
from runtimes.base import RuntimeInfo
from runtimes.selection import Choice

AgentState = Literal["starting", "online", "stopping", "offline"]


#: a TensorRT engine build (`agent.serving.engine_builder`)
BuildState = Literal["building", "ready", "failed", "cancelled"]


@dataclass(frozen=True)
class EngineStatus:
    """A TensorRT engine build: the bundle version and ONNX artifact it is for, the precision
    asked, its state, TensorRT's current phase and the fraction done (0..1), Unix times it
    started and ended, and for a failure the error code and a message a technician can act on
    (what serves meanwhile is in `note`)."""

    bundle: str
    artifact: str
    precision: str
    state: BuildState
    phase: str | None
    progress: float
    started: float
    finished: float | None = None
    error_code: str | None = None
    message: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class VersionRef:
    """An installed bundle version."""

    name: str
    version: str
    sha256: str

    @staticmethod
    def of(info: VersionInfo | None) -> VersionRef | None:
        """The reference to an installed version (None: nothing installed there)."""
        return VersionRef(info.name, info.version, info.sha256) if info is not None else None


@dataclass(frozen=True)
class Serving:
    """The runtime serving the cameras: `runtime` on `device` with `artifact`, and why the
    selection policy chose it."""

    runtime: str
    device: str
    artifact: str
    reason: str

    @staticmethod
    def of(choice: Choice | None) -> Serving | None:
        """What the cameras are served by, from the selection's `choice` (its artifact by file name)."""
        if choice is None:
            return None
        return Serving(choice.runtime, choice.device, Path(choice.artifact.path).name, choice.reason)


@dataclass(frozen=True)
class DeploymentStatus:
    """The last deployment (or rollback) on this device: its state, its error (code and message
    a technician can act on), while it downloads, its progress, and what the shadow (before the
    switch) and probation's quality check (after it) judged the version to see, as the
    deployment document carries them (at most 20 classes per camera)."""

    id: str
    name: str | None
    version: str | None
    sha256: str
    state: State
    error: ErrorInfo | None
    attempt: int
    progress: DownloadProgress | None = None
    shadow: ShadowRecord | None = None
    quality: QualityRecord | None = None


@dataclass(frozen=True)
class RolloutPosition:
    """This device in a staged rollout of its group: its `wave` of `waves` (from 1), when that
    wave opens (`opens_at`, Unix seconds by this device's clock) and where it stands: ``waiting``
    for its wave, ``open`` (it may start or has started), ``halted`` by the operator."""

    deployment: str
    wave: int
    waves: int
    opens_at: float
    state: str


@dataclass(frozen=True)
class EventCounts:
    """Object events published, and updates held back by ``events.min_interval_s``, since the
    agent started; the second stage's crops classified and dropped (its queue was full: the
    oldest went)."""

    published: int
    suppressed: int
    classified: int = 0
    classify_dropped: int = 0


@dataclass(frozen=True)
class GovernorState:
    """The governor as the daemon carried it out: its last `decision`, when its level began as
    Unix seconds (`since_ts`), the fan duty set (percent; None without a fan or before the
    first set) and the fan's problem if it could not be set."""

    decision: Decision
    since_ts: float
    fan_percent: float | None
    fan_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """``telemetry.governor``: level, reason, since and the actions in force."""
        d, actions = self.decision, self.decision.actions
        t = d.thresholds
        return {
            "level": d.level,
            "thermal": d.thermal.value,
            "battery": d.battery.value,
            "reason": d.reason,
            "since": round(self.since_ts, 3),
            "actions": {
                "fps_cap": actions.fps_cap,
                "gate_slowdown": actions.gate_slowdown,
                "gated_fps_cap": actions.gated_fps_cap,
                "paused": actions.paused,
                "fan": self.fan_percent,
                "artifact": actions.artifact,
                "stopped": actions.stopped,
            },
            "thresholds_c": {"warm": t.warm_c, "hot": t.hot_c, "critical": t.critical_c} if t else None,
            "fan_error": self.fan_error,
        }


@dataclass(frozen=True)
class ThresholdsInForce:
    """What one camera keeps of its model's detections now: scores above `conf`, NMS at `iou`,
    at most `max_det` per frame, only the label names in `classes` (None: every class).
    `configured` names those of conf, iou, max_det, classes that agent.yaml sets for the camera
    (``cameras[]``); the others are the serving bundle's manifest's. `problems`: what in the
    camera's config the serving version cannot honour (a class name it lacks), with file:line."""

    camera: str
    conf: float
    iou: float
    max_det: int
    classes: tuple[str, ...] | None = None
    configured: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class MotionView:
    """What a motion-gated camera's detector (``cameras[].motion.enabled``) saw on its newest
    frame, for the status page to draw over the live frame: `regions` (at most
    `pipelines.motion.MAX_REGIONS`) as xyxy boxes and `masks` (agent.yaml's) as polygons, both in
    frame pixels; `changed` the fraction (0..1) of unmasked pixels that differed from the
    background; `recalibrated` when that frame was a global change (lights, IR). `regions` is
    empty and `changed` 0 before the first frame (or on a frame the detector failed on). The
    gate's shares of frames inferred and with motion since the camera started, 0..1."""

    camera: str
    regions: tuple[tuple[float, float, float, float], ...]
    masks: tuple[tuple[tuple[float, float], ...], ...]
    changed: float
    recalibrated: bool
    inferred_ratio: float
    motion_ratio: float


@dataclass(frozen=True)
class MediaUsage:
    """The events' snapshots and clips kept on disk (`agent.daemon.media`): `files`, their
    `bytes`, the oldest one's age (seconds; None when there is none); the clips written and
    dropped since the start; why media is not kept now (`problem`: the disk under
    ``events.media.min_free_mb``, or refusing writes; None when it is kept)."""

    files: int
    bytes: int
    oldest_age_s: float | None
    clips_written: int = 0  # clips written since the start (`agent.daemon.clips`)
    clips_dropped: int = 0  # clips dropped: the writer behind, too many at once, or the disk refused
    problem: str | None = None


EnrolmentState = Literal["waiting", "denied", "expired"]


@dataclass(frozen=True)
class EnrolmentStatus:
    """A device started with only a claim (`agent.daemon.enrol_start`, docs/fleet.md#enrolment):
    `state` waiting for the operator's approval, or the final denied or expired; the `claim`, the
    `request_id` the operator approves (None until the request is made) and the device id it asks
    for; `since` when this request was made (Unix s; when the wait began, before that); the next
    attempt after a failed one (`next_retry`, Unix s; None while the request is out) and the last
    problem, or the refusal's words (`reason`)."""

    state: EnrolmentState
    claim: str
    device_id: str
    request_id: str | None
    since: float
    next_retry: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class AgentSnapshot:
    """The whole agent. `broker` is None when no broker is configured; `system` is None until
    the first sample; `sensors` holds the temperature, power and battery readings (None until
    the sensors are read); `governor` is None while it is disabled or before its first step;
    `runtimes` the backends probed at start, each available or why not (`RuntimeInfo.crashed`
    when its library killed the probe process); `engine` is the TensorRT engine build in
    progress or the last one."""

    ts: float
    state: AgentState
    device: str
    group: str | None
    agent_version: str
    board: Board
    bundle: VersionRef | None
    previous: VersionRef | None
    serving: Serving | None
    serving_error: str | None
    deployment: DeploymentStatus | None
    deployment_problem: str | None
    cameras: tuple[PipelineStats, ...]
    broker: LinkStats | None
    system: SystemReadings | None
    events: EventCounts
    warnings: tuple[str, ...] = ()  # what the config allows that an attacker could use, and repairs made
    sensors: SensorReadings | None = None
    governor: GovernorState | None = None
    rollout: RolloutPosition | None = None  # this device in its group's staged rollout
    runtimes: tuple[RuntimeInfo, ...] = ()
    engine: EngineStatus | None = None  # the TensorRT engine build in progress, or the last one
    analytics: tuple[CameraCounts, ...] = ()  # each camera's line and zone counters (docs/analytics.md)
    thresholds: tuple[ThresholdsInForce, ...] = ()  # each camera's detection thresholds in force
    outbox: OutboxStats | None = None  # the messages waiting for the broker (None: no broker)
    analytics_since: float | None = None  # when the line and zone totals started counting (Unix s)
    media: MediaUsage | None = None  # the events' snapshots kept (None: events.snapshots is off)
    runtime_plugins: tuple[str, ...] = ()  # each runtime plugin left out, and why (runtimes.registry)
    drift: tuple[CameraDrift, ...] = ()  # each camera's drift score (drift.enabled; agent.serving.drift_watch)
    motion: tuple[MotionView, ...] = ()  # each motion-gated camera's newest motion (the page draws it)
    energy: Energy | None = None  # the input power integrated since the start (None: not measured)
    enrolment: EnrolmentStatus | None = None  # set only while a device with only a claim waits (enrol_start)

    def analytics_json(self) -> dict[str, Any]:
        """``{"lines": {name: {"in", "out"}}, "zones": {name: {"now", "total"}}, "since"}`` over
        every camera (names are unique over the cameras: the config checks it); ``since`` (Unix
        seconds, when the totals started counting) only when known."""
        document: dict[str, Any] = self.analytics_of(self.analytics)
        if self.analytics_since is not None:
            document["since"] = round(self.analytics_since, 3)
        return document

    @staticmethod
    def analytics_of(cameras: tuple[CameraCounts, ...]) -> dict[str, dict[str, dict[str, int]]]:
        """The cameras' line and zone totals keyed by name (see `analytics_json`)."""
        return {
            "lines": {line.name: {"in": line.forward, "out": line.backward} for c in cameras for line in c.lines},
            "zones": {zone.name: {"now": zone.now, "total": zone.total} for c in cameras for zone in c.zones},
        }

    @property
    def fps(self) -> float:
        """Frames inferred per second over all cameras."""
        return round(sum(camera.fps for camera in self.cameras), 2)

    @property
    def energy_mj_per_frame(self) -> float | None:
        """The board's input power divided by the frames inferred per second over all cameras,
        in millijoules per frame; None when the power is unknown or no frame is inferred."""
        power_w = self.sensors.power_w if self.sensors else None
        fps = self.fps
        return round(power_w / fps * 1000, 1) if power_w is not None and fps > 0 else None

    def energy_json(self) -> dict[str, float | None] | None:
        """``{"energy_wh", "energy_wh_per_h", "measured_s"}`` since the agent started, rounded
        (None: the power is not measured here)."""
        energy = self.energy
        if energy is None:
            return None
        per_h = energy.wh_per_h
        return {
            "energy_wh": round(energy.wh, 4),
            "energy_wh_per_h": round(per_h, 3) if per_h is not None else None,
            "measured_s": round(energy.measured_s, 1),
        }

    def to_json(self) -> dict[str, Any]:
        """The snapshot as JSON-ready dicts and lists (the status page's ``/api/status``)."""
        # each camera's rates hold their classes in a read-only mapping, which `asdict`'s deep
        # copy cannot take: the same numbers in a dict
        cameras = tuple(
            dataclasses.replace(c, rates=dataclasses.replace(c.rates, classes=dict(c.rates.classes)))
            for c in self.cameras
        )
        document = dataclasses.asdict(dataclasses.replace(self, cameras=cameras))
        document["sensors"] = self.sensors.to_json() if self.sensors else None
        document["governor"] = self.governor.to_json() if self.governor else None
        document["fps"] = self.fps
        document["energy_mj_per_frame"] = self.energy_mj_per_frame
        document["energy"] = self.energy_json()
        document["analytics"] = self.analytics_json()
        document["cameras_analytics"] = {
            c.camera: {
                "lines": [{"name": x.name, "in": x.forward, "out": x.backward} for x in c.lines],
                "zones": [{"name": z.name, "now": z.now, "total": z.total} for z in c.zones],
                "tracks": c.tracks,
            }
            for c in self.analytics
        }
        # each camera's entry: {..., "thresholds": {conf, iou, ...} | null, "motion": {regions, masks, ...} | null}
        per_camera = {
            "thresholds": {t.camera: dataclasses.asdict(t) for t in self.thresholds},
            "motion": {m.camera: dataclasses.asdict(m) for m in self.motion},  # null: no motion gate
        }
        for key, found in per_camera.items():
            del document[key]
            for camera in document["cameras"]:
                mine = found.get(camera["name"])
                camera[key] = {k: v for k, v in mine.items() if k != "camera"} if mine else None
        return document


@dataclass(frozen=True)
class Health:
    """Whether the daemon's loops turn: `ok` when every camera's threads, the MQTT link's loop
    and the daemon's own loops (the sampler, the commands) turned within the stall limit;
    `problems` says which did not, in words. ``/healthz`` answers from it, and the systemd
    watchdog is pinged only while it is ok."""

    ok: bool
    problems: tuple[str, ...] = ()


def judge_health(
    cameras: tuple[PipelineStats, ...], broker: LinkStats | None, loops: tuple[LoopState, ...], stall_s: float
) -> Health:
    """`Health` from how far each loop is past its announced turn (seconds) and the limit; a
    loop whose thread ended is a problem at once."""
    problems = [
        f"camera {camera.name}: a capture or inference thread has not turned for {camera.stalled_s:.0f} s"
        for camera in cameras
        if camera.stalled_s > stall_s
    ]
    if broker is not None and broker.stalled_s > stall_s:
        problems.append(f"the MQTT link's loop has not turned for {broker.stalled_s:.0f} s")
    for loop in loops:
        if loop.ended is not None:
            problems.append(f"{loop.name} is not running: {loop.ended}")
        elif loop.unstopped is not None:
            problems.append(f"{loop.name} was asked to stop {loop.unstopped:.0f} s ago and is still running")
        elif loop.stalled_s > stall_s:
            problems.append(f"{loop.name} has not turned for {loop.stalled_s:.0f} s")
        elif loop.failing is not None:
            problems.append(f"{loop.name} fails its turns ({loop.failures} so far) and keeps trying: {loop.failing}")
    return Health(not problems, tuple(problems))
