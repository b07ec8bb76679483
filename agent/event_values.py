"""The events a device reports, as frozen values: `ObjectEvent` (a tracked object's ``start``,
``update`` and ``end``, made by `agent.serving.events.EventSink`), `GovernorEvent` (a
governor transition, made by `agent.daemon.governing.Governing`) and `CameraEvent` (a camera
health problem's start and end, made by the daemon from `pipelines.health_watch`); `Event` is
any of them.

They travel typed from the thread that made them (a camera's inference thread, the sampler)
through the daemon to the ``events`` topic and the status page, and become JSON once, at that
edge: `to_json` is the ``events`` topic's document without its ``device`` (the daemon puts
that first), and ``GET /api/events`` lists the `to_json` of each `without_crop()`. The shapes
are docs/mqtt.md's and docs/analytics.md's; numbers are rounded there (times to the
millisecond, confidence to 4 places, boxes to 0.1 pixel), not here.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from agent.governor.levels import BatteryLevel, ThermalLevel
from pipelines.camera_health import ProblemKind
from pipelines.health_watch import ACTIONS, ProblemSeen
from pipelines.tracking.shapes import ObjectShape

ObjectEventKind = Literal["start", "update", "end"]
#: why a camera's problem ended without clearing: a reload removed the camera, or rebuilt its check
CameraEndReason = Literal["camera removed", "camera reconfigured"]


@dataclass(frozen=True)
class LineCrossing:
    """A counting line an object crossed, and which way (the line's ``forward`` or ``backward``)."""

    line: str
    direction: str  # "forward" or "backward"


@dataclass(frozen=True)
class ObjectClass:
    """The second stage's answer for one tracked object (a bundle's ``classifier``): the
    classifier's top `label` and `class_id`, its `score` (0..1), and `at`, the agent's monotonic
    clock when the crop was classified (seconds)."""

    label: str
    class_id: int
    score: float
    at: float


@dataclass(frozen=True)
class ObjectEvent:
    """One tracked object's event (docs/analytics.md): `kind` ``start``, ``update`` or ``end``;
    `ts` when it was made (Unix seconds); the `camera`, the object's event id
    (`object_id`, the same on its start, updates and end) and its tracker id; its `label` and
    `class_id`; `confidence`, `box` (xyxy, source-frame pixels) and `frame` of its most
    confident detection so far; `duration_s` since it was first seen (frame seconds); the
    `zones` it entered with their dwell seconds, in the order entered; the `lines` it crossed,
    in order; on an ``end`` with ``events.snapshots``, `snapshot_jpeg`, the JPEG crop of its
    best frame (bytes; base64 in JSON), or once the daemon kept it on disk `snapshot`, its
    reference (``<object_id>.jpg``, fetched with the ``media`` command); on a camera with
    ``clips``, `clip`, the reference of the short clip around its start (``<object_id>.mp4``,
    on its start and end; written once ``post_s`` has passed, fetched with ``media`` and
    ``clip: true``); `classification`, the second stage's latest answer for the object (None:
    the bundle has no classifier, or none yet); `shape` the best detection's mask outline,
    keypoints or oriented box (task models; None for boxes)."""

    kind: ObjectEventKind
    ts: float
    camera: str
    object_id: str
    track_id: int
    label: str
    class_id: int
    confidence: float
    box: tuple[float, float, float, float]
    frame: int
    duration_s: float
    zones: tuple[tuple[str, float], ...] = ()
    lines: tuple[LineCrossing, ...] = ()
    snapshot_jpeg: bytes | None = field(default=None, repr=False)
    snapshot: str | None = None  # the kept snapshot's reference, in place of the crop
    clip: str | None = None  # the reference of the clip around its start (agent.daemon.clips)
    classification: ObjectClass | None = None
    shape: ObjectShape | None = None

    def without_crop(self) -> ObjectEvent:
        """The event without its JPEG crop (what the page lists, and what is kept for it)."""
        return self if self.snapshot_jpeg is None else dataclasses.replace(self, snapshot_jpeg=None)

    def to_json(self) -> dict[str, object]:
        """The ``events`` topic's document, less ``device``: ``{"type", "ts", "camera",
        "pipeline", "object_id", "track_id", "label", "class_id", "confidence", "box", "frame",
        "duration_s", "zones": {name: dwell_s}, "lines": [{"line", "direction"}]}`` (``pipeline``, the
        same as ``camera``, is deprecated), and
        ``snapshot_jpeg`` (base64) when the event carries a crop, ``snapshot`` (a reference)
        when it was kept on disk instead, ``clip`` (a reference) when a clip is kept;
        ``classification`` (``{"label", "class_id", "score"}``) when the second stage has
        classified the object; for a task model's object ``"shape": {"polygons":
        [[[x, y], ...], ...], "keypoints": [[x, y, score], ...], "obb": {"cx", "cy", "w", "h",
        "angle"}}`` with only the parts it has (pixels to 0.1, scores and radians to 4 places)."""
        document: dict[str, object] = {
            "type": self.kind,
            "ts": round(self.ts, 3),
            "camera": self.camera,
            "pipeline": self.camera,  # its old name, deprecated: kept for one release
            "object_id": self.object_id,
            "track_id": self.track_id,
            "label": self.label,
            "class_id": self.class_id,
            "confidence": round(self.confidence, 4),
            "box": [round(v, 1) for v in self.box],
            "frame": self.frame,
            "duration_s": round(self.duration_s, 3),
            "zones": dict(self.zones),
            "lines": [{"line": crossing.line, "direction": crossing.direction} for crossing in self.lines],
        }
        if self.snapshot_jpeg is not None:
            document["snapshot_jpeg"] = base64.b64encode(self.snapshot_jpeg).decode("ascii")
        if self.snapshot is not None:
            document["snapshot"] = self.snapshot
        if self.clip is not None:
            document["clip"] = self.clip
        if self.classification is not None:
            document["classification"] = {
                "label": self.classification.label,
                "class_id": self.classification.class_id,
                "score": round(self.classification.score, 4),
            }
        if self.shape is not None:
            document["shape"] = _shape_json(self.shape)
        return document


def _shape_json(shape: ObjectShape) -> dict[str, object]:
    out: dict[str, object] = {}
    if shape.polygons:
        out["polygons"] = [[[round(x, 1), round(y, 1)] for x, y in part] for part in shape.polygons]
    if shape.keypoints:
        out["keypoints"] = [[round(x, 1), round(y, 1), round(s, 4)] for x, y, s in shape.keypoints]
    if shape.obb is not None:
        cx, cy, w, h, angle = shape.obb
        out["obb"] = {
            "cx": round(cx, 1),
            "cy": round(cy, 1),
            "w": round(w, 1),
            "h": round(h, 1),
            "angle": round(angle, 4),
        }
    return out


@dataclass(frozen=True)
class GovernorEvent:
    """A governor transition: `ts` (Unix seconds), the `level` it reached and the one it left
    (`previous`, None on the first step), both axes (`thermal`, `battery`), the `reason` in
    words, and the hottest temperature (°C) and battery charge (percent) the step saw (None:
    unknown)."""

    ts: float
    level: str
    previous: str | None
    thermal: ThermalLevel
    battery: BatteryLevel
    reason: str
    temp_c: float | None
    battery_percent: float | None
    kind: Literal["governor"] = "governor"

    def without_crop(self) -> GovernorEvent:
        return self

    def to_json(self) -> dict[str, object]:
        """``{"type": "governor", "ts", "level", "previous", "thermal", "battery", "reason",
        "temp_c", "battery_percent"}``."""
        return {
            "type": self.kind,
            "ts": round(self.ts, 3),
            "level": str(self.level),
            "previous": str(self.previous) if self.previous is not None else None,
            "thermal": self.thermal.value,
            "battery": self.battery.value,
            "reason": self.reason,
            "temp_c": self.temp_c,
            "battery_percent": self.battery_percent,
        }


@dataclass(frozen=True)
class CameraEvent:
    """A camera health problem (docs/cameras.md "Camera health") that started (`change`
    ``start``) or cleared (``end``): `ts` when (Unix seconds), the `camera`, the `problem`'s
    kind, `since` when its condition began (Unix seconds), `detail` (the numbers, in words) and
    `action` (what a technician does about it); `reason`, on an ``end`` the check did not see
    (the camera removed or rebuilt by a reload), why it ended (None: the problem cleared)."""

    ts: float
    camera: str
    problem: ProblemKind
    change: Literal["start", "end"]
    since: float
    detail: str
    action: str
    kind: Literal["camera"] = "camera"
    reason: CameraEndReason | None = None

    @staticmethod
    def of(
        camera: str,
        problem: ProblemSeen,
        change: Literal["start", "end"],
        ts: float,
        reason: CameraEndReason | None = None,
    ) -> CameraEvent:
        """The event of `camera`'s `problem` starting or clearing (`change`) at `ts`; `reason`
        why an ``end`` came without the problem clearing."""
        kind, since, detail = problem.kind, problem.since, problem.detail
        return CameraEvent(ts, camera, kind, change, since, detail, ACTIONS[kind], reason=reason)

    def without_crop(self) -> CameraEvent:
        return self

    def to_json(self) -> dict[str, object]:
        """``{"type": "camera", "ts", "camera", "problem", "change", "since", "detail", "action"}``."""
        return {
            "type": self.kind,
            "ts": round(self.ts, 3),
            "camera": self.camera,
            "problem": self.problem,
            "change": self.change,
            "since": round(self.since, 3),
            "detail": self.detail,
            "action": self.action,
        } | ({"reason": self.reason} if self.reason is not None else {})


Event = ObjectEvent | GovernorEvent | CameraEvent
