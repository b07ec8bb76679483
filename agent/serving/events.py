"""Object events for the ``events`` topic, and each camera's analytics (tracks, lines, zones).

Each camera's frames go through its `pipelines.tracking.analytics.SceneAnalytics` (the tracker after
NMS, then its counting lines and zones); `EventSink` turns what changed into one `ObjectEvent`
per object event (docs/analytics.md, docs/mqtt.md):

- ``start``: a confirmed track of a wanted label (``events.labels``) once its best score reaches
  ``events.min_confidence``;
- ``update``: while it lives, at most every ``events.min_interval_s`` (frame time), and only
  when something changed (a better detection, a zone entered, a line crossed); a change that
  has to wait counts as `suppressed`;
- ``end``: when the tracker gives the track up (lost for longer than its buffer), with
  ``duration_s``, the zones visited with their dwell, the lines crossed, and with
  ``events.snapshots`` a JPEG crop of its best frame.

With a bundle's second stage (`agent.serving.classifying`), every tracked object of a frame is
offered to it, and each event carries the object's latest class (``classification``); a new
answer is news for an ``update``.

An object makes one ``start`` and one ``end``, never one per frame. Each event is an
`agent.event_values.ObjectEvent` handed to `publish`; the daemon turns it into JSON. Threads: `handle` runs on
each camera's inference thread, in frame order (the pipeline's sinks); `counts` and the
counters are read from any thread. Memory: a camera holds the live tracks only.

The line and zone totals survive restarts (docs/analytics.md): the daemon keeps them in the
outbox file each time a frame changes one (`counted`), hands them back at start (`restore`), and
`reset` (the ``reset-counts`` command) sets them to zero; `since` is when they started counting.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from agent.config.models import CameraSection, EventsSection
from agent.event_values import LineCrossing, ObjectClass, ObjectEvent, ObjectEventKind
from agent.serving.classifying import ClassifyingStage
from pipelines.annotate import encode_jpeg
from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame
from pipelines.tracking.analytics import CameraCounts, SceneAnalytics, TrackRecord
from pipelines.tracking.anchors import AnchorSpec, parse_anchor
from pipelines.tracking.tracker import TrackerSettings
from pipelines.tracking.zones import LineSpec, ZoneSpec

#: where the events go (the daemon: the ``events`` topic and the page's recent events)
Publish = Callable[[ObjectEvent], None]


def _point(xy: list[float]) -> tuple[float, float]:
    return float(xy[0]), float(xy[1])


def _anchor(text: str | None) -> AnchorSpec | None:
    return None if text is None else parse_anchor(text)


def scene_for(section: CameraSection, label: Callable[[int], str], keep_crops: bool = False) -> SceneAnalytics:
    """The analytics of one configured camera (its lines, zones, anchor and tracker)."""
    tracker = section.tracker
    return SceneAnalytics(
        section.name,
        lines=[
            LineSpec(line.name, _point(line.points[0]), _point(line.points[1]), _anchor(line.anchor))
            for line in section.lines
        ],
        zones=[
            ZoneSpec(z.name, tuple(_point(p) for p in z.polygon), frozenset(z.labels), _anchor(z.anchor))
            for z in section.zones
        ],
        label=label,
        tracker=TrackerSettings(
            high_score=tracker.high_score,
            low_score=tracker.low_score,
            new_track_score=tracker.new_track_score,
            lost_frames=tracker.lost_frames,
        ),
        anchor=parse_anchor(section.anchor),
        keep_crops=keep_crops,
    )


@dataclass(frozen=True)
class SavedTotal:
    """One line's or zone's total as kept across restarts: a line's `a` crossings forward
    (``in``) and `b` backward (``out``), a zone's `a` distinct tracks entered (`b` 0)."""

    camera: str
    kind: Literal["line", "zone"]
    name: str
    a: int
    b: int


@dataclass
class _Announced:
    """A track that had its ``start``: its event id, when its last event went out (frame
    seconds) and what that event said (to tell whether an update has news)."""

    object_id: str
    last_sent: float
    said: tuple[float, int, int, ObjectClass | None]  # best score, zones entered, lines crossed, the class


class EventSink:
    """The cameras' analytics and their object events (see the module text). `sections` are the
    configured cameras; `labels()` the serving version's labels; `wall` gives the events' Unix
    time."""

    def __init__(
        self,
        settings: EventsSection,
        labels: Callable[[], Sequence[str]],
        publish: Publish,
        sections: Sequence[CameraSection] = (),
        wall: Callable[[], float] = time.time,
        counted: Callable[[], None] = lambda: None,
        stage: ClassifyingStage | None = None,
    ) -> None:
        """`counted` is called (on the camera's inference thread) after a frame changed a line
        or zone total, so the daemon can keep them. `stage`, the second stage, is offered every
        tracked object of each frame (it decides which to classify) and its answers go on the
        objects' events (an answer that is new is news for an ``update``)."""
        self.settings, self._labels, self._publish, self._wall = settings, labels, publish, wall
        self._counted = counted
        self.stage = stage
        self._scenes = {s.name: scene_for(s, self.label, settings.enabled and settings.snapshots) for s in sections}
        self._announced: dict[tuple[str, int], _Announced] = {}
        self._lock = threading.Lock()
        self.published = 0
        self.suppressed = 0
        self.since = wall()  # when the line and zone totals started counting (Unix seconds)

    def label(self, class_id: int) -> str:
        labels = self._labels()
        return labels[class_id] if 0 <= class_id < len(labels) else str(class_id)

    def for_pipeline(self, name: str) -> Callable[[Frame, Detections], None]:
        def sink(frame: Frame, detections: Detections) -> None:
            self.handle(name, frame, detections)

        return sink

    def scene(self, pipeline: str) -> SceneAnalytics:
        """The camera's analytics (made on first use for a camera not configured up front)."""
        with self._lock:
            if pipeline not in self._scenes:
                self._scenes[pipeline] = SceneAnalytics(pipeline, label=self.label)
            return self._scenes[pipeline]

    def counts(self) -> list[CameraCounts]:
        """Every camera's line and zone counters now (any thread)."""
        with self._lock:
            scenes = list(self._scenes.values())
        return [scene.counts() for scene in scenes]

    def restore(self, totals: Sequence[SavedTotal], since: float) -> None:
        """Count on from totals kept before a restart (before the cameras run), counting since
        `since` (Unix seconds); totals of lines, zones or cameras no longer configured are left out."""
        with self._lock:
            scenes = dict(self._scenes)
            self.since = since
        for camera, scene in scenes.items():
            mine = [t for t in totals if t.camera == camera]
            scene.restore(
                {t.name: (t.a, t.b) for t in mine if t.kind == "line"}, {t.name: t.a for t in mine if t.kind == "zone"}
            )

    def reset(self) -> float:
        """Every camera's line and zone totals back to zero from now (the ``reset-counts``
        command); returns the new `since` (Unix seconds)."""
        with self._lock:
            scenes = list(self._scenes.values())
            self.since = self._wall()
        for scene in scenes:
            scene.reset()
        self._counted()
        return self.since

    def totals(self) -> list[SavedTotal]:
        """Every camera's line and zone totals now, as kept across restarts (any thread)."""
        found = []
        for camera in self.counts():
            found += [
                SavedTotal(camera.camera, "line", line.name, line.forward, line.backward) for line in camera.lines
            ]
            found += [SavedTotal(camera.camera, "zone", zone.name, zone.total, 0) for zone in camera.zones]
        return found

    def held(self) -> int:
        """Per-track entries held over every camera (0 after `finish`: no per-track leak)."""
        with self._lock:
            scenes = list(self._scenes.values())
        return len(self._announced) + sum(scene.held() for scene in scenes)

    def handle(self, pipeline: str, frame: Frame, detections: Detections) -> None:
        """One frame of one camera, in frame order: track, count, publish what changed."""
        scene = self.scene(pipeline)
        step = scene.update(frame, detections)
        if step.crossings or step.entered:
            self._counted()
        ids = step.detections.tracker_id
        if self.stage is not None and self.stage.active and ids is not None:
            for i in np.flatnonzero(ids >= 0):
                # the track's label (its best detection's, what its events say) picks the
                # classifier's ``for``; the crop is this frame's box
                tracked = scene.record(int(ids[i]))
                class_id = tracked.class_id if tracked is not None else int(step.detections.class_id[i])
                box = step.detections.xyxy[i].tolist()
                self.stage.offer(pipeline, int(ids[i]), self.label(class_id), frame.image, box)
        if not self.settings.enabled:
            for gone in step.ended:
                self._forget(pipeline, gone.track_id)
            return
        for track_id in sorted({int(t) for t in ids if t >= 0} if ids is not None else ()):
            record = scene.record(track_id)
            if record is not None:
                self._live(pipeline, frame, record)
        for record in step.ended:
            announced = self._announced.pop((pipeline, record.track_id), None)
            if announced is not None:
                self._send("end", pipeline, record, announced.object_id)
            self._forget(pipeline, record.track_id)

    def _forget(self, pipeline: str, track_id: int) -> None:
        if self.stage is not None:
            self.stage.forget(pipeline, track_id)

    def _class_of(self, pipeline: str, track_id: int) -> ObjectClass | None:
        return self.stage.result(pipeline, track_id) if self.stage is not None else None

    def _live(self, pipeline: str, frame: Frame, record: TrackRecord) -> None:
        key, now = (pipeline, record.track_id), frame.timestamp
        news = (record.best_score, len(record.zones), len(record.lines), self._class_of(pipeline, record.track_id))
        announced = self._announced.get(key)
        if announced is None:
            wanted = not self.settings.labels or self.label(record.class_id) in self.settings.labels
            if wanted and record.best_score >= self.settings.min_confidence:
                announced = _Announced(uuid.uuid4().hex[:16], now, news)
                self._announced[key] = announced
                self._send("start", pipeline, record, announced.object_id)
            return
        if news == announced.said:
            return
        if now - announced.last_sent < self.settings.min_interval_s:
            with self._lock:
                self.suppressed += 1
            return
        announced.last_sent, announced.said = now, news
        self._send("update", pipeline, record, announced.object_id)

    def _send(self, kind: ObjectEventKind, pipeline: str, record: TrackRecord, object_id: str) -> None:
        crop = None
        if kind == "end" and record.crop is not None and record.crop.size:
            crop = encode_jpeg(record.crop, 85)
        event = ObjectEvent(
            kind=kind,
            ts=self._wall(),
            camera=pipeline,
            object_id=object_id,
            track_id=record.track_id,
            label=self.label(record.class_id),
            class_id=record.class_id,
            confidence=record.best_score,
            box=record.best_box,
            frame=record.best_frame,
            duration_s=record.duration_s,
            zones=record.zones,
            lines=tuple(LineCrossing(line, direction) for line, direction in record.lines),
            snapshot_jpeg=crop,
            classification=self._class_of(pipeline, record.track_id),
            shape=record.shape,
        )
        with self._lock:
            self.published += 1
        self._publish(event)

    def finish(self) -> None:
        """End every camera's live tracks (the agent stops): their ``end`` events go out."""
        with self._lock:
            scenes = list(self._scenes.items())
        for pipeline, scene in scenes:  # the cameras are stopped: no `handle` runs meanwhile
            for record in scene.finish():
                announced = self._announced.pop((pipeline, record.track_id), None)
                if announced is not None and self.settings.enabled:
                    self._send("end", pipeline, record, announced.object_id)
                self._forget(pipeline, record.track_id)
