"""One camera's video analytics: the tracker, its counting lines and zones, and a record of
every track (when it began, its best detection, the zones it visited, the lines it crossed).

`SceneAnalytics.update(frame, detections)` runs once per frame, in frame order, after NMS; it
returns an `AnalyticsStep`: the detections with `tracker_id`, the tracks confirmed this frame,
the tracks that ended (lost for longer than the tracker's buffer) and the crossings counted.
Times are the frames' own timestamps (seconds, `time.monotonic()` for a camera, or a clip's
frame times), so a test drives it with any clock it likes.

Threads: `update` from the camera's inference thread (the pipeline's sinks); `counts` and
`live` from any thread (one lock). Memory: a track's record, crop and line/zone state are
dropped when it ends, so a camera that sees objects come and go for days holds only the live
ones.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame
from pipelines.tracking.anchors import AnchorSpec, anchor_points
from pipelines.tracking.shapes import ObjectShape, shape_of
from pipelines.tracking.tracker import ByteTracker, TrackerSettings
from pipelines.tracking.zones import (
    Anchor,
    Crossing,
    LineCount,
    LineCounter,
    LineSpec,
    ZoneCount,
    ZoneCounter,
    ZoneSpec,
)


@dataclass(frozen=True)
class TrackRecord:
    """One object as tracked so far: `first_ts` / `last_ts` the frame times it was first and
    last seen (seconds), `best_score` and `best_box` (xyxy pixels) of its most confident
    detection, at frame `best_frame`, with that detection's `class_id`; `zones` it entered
    with their dwell seconds, `lines` it crossed as ``(line, direction)`` in order; `crop`
    the best detection's pixels (BGR) when snapshots are kept; `shape` that detection's mask
    outline, keypoints or oriented box (`pipelines.tracking.shapes`; None for a box detector)."""

    track_id: int
    class_id: int
    first_ts: float
    last_ts: float
    best_score: float
    best_box: tuple[float, float, float, float]
    best_frame: int
    zones: tuple[tuple[str, float], ...] = ()
    lines: tuple[tuple[str, str], ...] = ()
    crop: npt.NDArray[np.uint8] | None = field(default=None, repr=False, compare=False)
    shape: ObjectShape | None = None

    @property
    def duration_s(self) -> float:
        return self.last_ts - self.first_ts


@dataclass(frozen=True)
class AnalyticsStep:
    """What one frame changed (see the module text)."""

    detections: Detections
    started: tuple[TrackRecord, ...] = ()
    ended: tuple[TrackRecord, ...] = ()
    crossings: tuple[Crossing, ...] = ()
    entered: tuple[tuple[str, int], ...] = ()  # (zone, track id) of each zone entered this frame


@dataclass(frozen=True)
class CameraCounts:
    """One camera's counters: per line and per zone, and how many tracks are alive."""

    camera: str
    lines: tuple[LineCount, ...]
    zones: tuple[ZoneCount, ...]
    tracks: int


def crop_box(image: npt.NDArray[np.uint8], box: npt.NDArray[np.float32] | Sequence[float]) -> npt.NDArray[np.uint8]:
    """The pixels of `image` ``(H, W, C)`` inside xyxy `box` (frame pixels; outward to whole
    pixels, clipped to the image), as a copy: the events' snapshots and the second stage's crops.
    Empty (a zero-sized axis) when the box lies outside the image."""
    height, width = image.shape[:2]
    x1, y1 = max(int(box[0]), 0), max(int(box[1]), 0)
    x2 = min(max(int(np.ceil(box[2])), 0), width)  # never negative: a slice would count it from the end
    y2 = min(max(int(np.ceil(box[3])), 0), height)
    crop: npt.NDArray[np.uint8] = image[y1:y2, x1:x2].copy()
    return crop


class SceneAnalytics:
    """Tracking, lines and zones for camera `camera`; `label(class_id)` names a class (zones
    filter by name); `keep_crops` keeps each track's best crop for the snapshots on ``end``."""

    def __init__(
        self,
        camera: str,
        lines: Sequence[LineSpec] = (),
        zones: Sequence[ZoneSpec] = (),
        label: Callable[[int], str] = str,
        tracker: TrackerSettings | None = None,
        anchor: Anchor | AnchorSpec = "center",
        keep_crops: bool = False,
    ) -> None:
        """`anchor`: the camera's anchor, for its lines and zones that name none of their own."""
        self.camera, self.keep_crops, self._label = camera, keep_crops, label
        self.anchor = anchor if isinstance(anchor, AnchorSpec) else AnchorSpec(anchor)
        self.tracker = ByteTracker(tracker or TrackerSettings())
        self.lines = [LineCounter(spec) for spec in lines]
        self.zones = [ZoneCounter(spec) for spec in zones]
        self._records: dict[int, TrackRecord] = {}
        self._lock = threading.Lock()
        empty = Detections.empty()
        #: the last inferred frame's: every detection (ids set), the tracked ones, their ids and
        #: filtered boxes (what a frame not inferred keeps, see `update`)
        self._seen: tuple[Detections, Detections, npt.NDArray[np.int32], npt.NDArray[np.float32]] = (
            empty,
            empty,
            np.zeros(0, np.int32),
            np.zeros((0, 4), np.float32),
        )

    def update(self, frame: Frame, detections: Detections) -> AnalyticsStep:
        """Track one frame's detections and count; see `AnalyticsStep`. A frame not inferred
        (`Frame.inferred` False, the motion gate's) coasts: `detections` (the last inferred
        frame's) are not tracked again; the tracker predicts on (`ByteTracker.coast`), the
        tracks seen last stay where they were seen for the zones and their records (nothing
        moved: no line is crossed), and tracks missing since end on time."""
        if not frame.inferred:
            return self._coast(frame)
        step = self.tracker.update(detections)
        every = step.detections.tracker_id
        every = np.full(len(step.detections), -1, np.int32) if every is None else every
        tracked, ids = step.detections[every >= 0], every[every >= 0]
        labels = [self._label(int(c)) for c in tracked.class_id]
        filtered = tracked.xyxy if step.filtered is None else step.filtered[every >= 0]
        points: dict[AnchorSpec, npt.NDArray[np.float64]] = {}

        def at(spec: AnchorSpec | None) -> npt.NDArray[np.float64]:
            spec = self.anchor if spec is None else spec
            if spec not in points:
                points[spec] = anchor_points(spec, filtered, tracked)
            return points[spec]

        heights = filtered[:, 3] - filtered[:, 1]
        self._seen = (step.detections, tracked, ids, filtered)
        with self._lock:
            for i, track_id in enumerate(ids.tolist()):
                self._observe(frame, tracked, i, track_id)
            crossings = [c for line in self.lines for c in line.update(ids, at(line.spec.anchor), labels, heights)]
            for crossing in crossings:
                record = self._records[crossing.track_id]
                self._records[crossing.track_id] = replace(
                    record, lines=(*record.lines, (crossing.line, crossing.direction))
                )
            entered = tuple(
                (zone.spec.name, track_id)
                for zone in self.zones
                for track_id in zone.update(frame.timestamp, ids, at(zone.spec.anchor), labels)
            )
            started = tuple(self._with_zones(self._records[t]) for t in step.started)
            ended = tuple(self._end(t) for t in step.ended)
        return AnalyticsStep(step.detections, started, ended, tuple(crossings), entered)

    def _coast(self, frame: Frame) -> AnalyticsStep:
        """A frame not inferred: see `update`."""
        ended_ids = self.tracker.coast()
        alive = set(self.tracker.active_ids)
        every, tracked, ids, filtered = self._seen
        kept = np.array([int(t) in alive for t in ids], bool)
        tracked, ids, filtered = tracked[kept], ids[kept], filtered[kept]
        labels = [self._label(int(c)) for c in tracked.class_id]
        with self._lock:
            for track_id in ids.tolist():
                if track_id in self._records:
                    self._records[track_id] = replace(self._records[track_id], last_ts=frame.timestamp)
            for zone in self.zones:
                zone.update(
                    frame.timestamp, ids, anchor_points(zone.spec.anchor or self.anchor, filtered, tracked), labels
                )
            ended = tuple(self._end(t) for t in ended_ids if t in self._records)
        return AnalyticsStep(every, (), ended, (), ())

    def _observe(self, frame: Frame, tracked: Detections, i: int, track_id: int) -> None:
        score, box = float(tracked.confidence[i]), tracked.xyxy[i]
        record = self._records.get(track_id)
        if record is None or score > record.best_score:
            best = TrackRecord(
                track_id,
                class_id=int(tracked.class_id[i]),
                first_ts=frame.timestamp if record is None else record.first_ts,
                last_ts=frame.timestamp,
                best_score=score,
                best_box=(float(box[0]), float(box[1]), float(box[2]), float(box[3])),
                best_frame=frame.index,
                lines=() if record is None else record.lines,
                crop=crop_box(frame.image, box) if self.keep_crops else None,
                shape=shape_of(tracked, i),
            )
            self._records[track_id] = best
        else:
            self._records[track_id] = replace(record, last_ts=frame.timestamp)

    def _with_zones(self, record: TrackRecord) -> TrackRecord:
        track_id = record.track_id
        zones = tuple((z.spec.name, round(z.dwell_s(track_id), 3)) for z in self.zones if z.visited(track_id))
        return replace(record, zones=zones)

    def _end(self, track_id: int) -> TrackRecord:
        record = self._records.pop(track_id)
        zones = []
        for zone in self.zones:
            dwell = zone.forget(track_id)
            if dwell is not None:
                zones.append((zone.spec.name, round(dwell, 3)))
        for line in self.lines:
            line.forget(track_id)
        return replace(record, zones=tuple(zones))

    def finish(self) -> tuple[TrackRecord, ...]:
        """End every live track (the camera stopped or the clip ended)."""
        with self._lock:
            return tuple(self._end(t) for t in self.tracker.reset() if t in self._records)

    def record(self, track_id: int) -> TrackRecord | None:
        """A live track's record with its zones so far (any thread); None once it ended."""
        with self._lock:
            record = self._records.get(track_id)
            return None if record is None else self._with_zones(record)

    def tracks_alive(self) -> bool:
        """Whether a confirmed track is alive now (any thread): the motion gate's keepalive."""
        with self._lock:
            return bool(self._records)

    def live(self) -> list[TrackRecord]:
        """The live tracks (any thread), with their zones so far."""
        with self._lock:
            return [self._with_zones(r) for r in self._records.values()]

    def held(self) -> int:
        """Per-track entries held (records, line sides, zone visits, tracker tracks): bounded by
        the live tracks, 0 after `finish` (what the soak and the tests check for leaks)."""
        with self._lock:
            lines = sum(line.held() for line in self.lines)
            zones = sum(zone.held() for zone in self.zones)
            return len(self._records) + lines + zones + len(self.tracker.active_ids)

    def restore(self, lines: Mapping[str, tuple[int, int]], zones: Mapping[str, int]) -> None:
        """Count on from saved totals: a line's (forward, backward), a zone's total, by name
        (names this camera does not have are ignored)."""
        with self._lock:
            for line in self.lines:
                if line.spec.name in lines:
                    line.restore(*lines[line.spec.name])
            for zone in self.zones:
                if zone.spec.name in zones:
                    zone.restore(zones[zone.spec.name])

    def reset(self) -> None:
        """Every line and zone total back to zero (any thread)."""
        with self._lock:
            for line in self.lines:
                line.reset()
            for zone in self.zones:
                zone.reset()

    def counts(self) -> CameraCounts:
        """The counters now (any thread)."""
        with self._lock:
            return CameraCounts(
                self.camera,
                tuple(line.count() for line in self.lines),
                tuple(zone.count() for zone in self.zones),
                len(self._records),
            )
