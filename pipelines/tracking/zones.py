"""Counting lines and zones over tracked objects, in source-frame pixels (``x`` right, ``y`` down).

A tracked object is reduced to one anchor point per frame (`anchor_points`: the box centre, or
the middle of its bottom edge, where a person or a vehicle touches the ground; a line or zone
may name its own anchor, `pipelines.tracking.anchors`: keypoints for pose, an oriented box's
centre).

- `LineCounter`: a directed segment P1 -> P2. An object crosses it when its anchor moves from one
  side to the other within the segment's extent. ``forward`` (``in``) is from the left of
  P1 -> P2 to its right as seen on the image (for a line drawn left to right: moving down).
  Jitter cannot count: the anchor (from the track's Kalman-filtered box) only takes a side once
  it is further from the line than a dead band (`margin_px`, or a tenth of the object's height
  if more: a near object's box jitters more), so an anchor wobbling across the line, or moving
  along it, keeps its side; each change of settled side counts one crossing.
- `ZoneCounter`: a polygon with optional class filter: which tracks are inside now, how many
  distinct tracks ever entered, and each track's dwell time (summed over its visits).

Threads: not thread-safe; one camera's analytics thread (its pipeline's sinks) drives them, the
counts are read through frozen values (`LineCount`, `ZoneCount`) built under that camera's
lock (`pipelines.tracking.analytics`). Memory: per-track state is dropped by `forget` when a track ends.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Literal

import cv2
import numpy as np
import numpy.typing as npt

from pipelines.tracking.anchors import AnchorSpec

Anchor = Literal["center", "bottom_center"]
Point = tuple[float, float]
Direction = Literal["forward", "backward"]


def anchor_points(xyxy: npt.NDArray[np.float32], anchor: Anchor) -> npt.NDArray[np.float64]:
    """``(n, 2)`` anchor points of ``(n, 4)`` xyxy boxes."""
    boxes = np.asarray(xyxy, np.float64).reshape(-1, 4)
    x = (boxes[:, 0] + boxes[:, 2]) / 2
    y = (boxes[:, 1] + boxes[:, 3]) / 2 if anchor == "center" else boxes[:, 3]
    return np.stack([x, y], axis=1)


@dataclass(frozen=True)
class LineSpec:
    """A counting line: `name`, endpoints `start` (P1) and `end` (P2) in pixels; `anchor` the
    point of an object it tests (``None``: the camera's)."""

    name: str
    start: Point
    end: Point
    anchor: AnchorSpec | None = None

    def __post_init__(self) -> None:
        if self.start == self.end:
            raise ValueError(f"line {self.name!r}: its two points are the same, {self.start}")


@dataclass(frozen=True)
class ZoneSpec:
    """A zone: `name`, `polygon` (at least three points, in pixels), `labels` (empty: every
    class) counted in it; `anchor` the point of an object it tests (``None``: the camera's)."""

    name: str
    polygon: tuple[Point, ...]
    labels: frozenset[str] = frozenset()
    anchor: AnchorSpec | None = None

    def __post_init__(self) -> None:
        if len(self.polygon) < 3:
            raise ValueError(f"zone {self.name!r}: a polygon needs at least 3 points, got {len(self.polygon)}")


@dataclass(frozen=True)
class Crossing:
    """One counted crossing of `line` by track `track_id` of class `label`."""

    line: str
    track_id: int
    label: str
    direction: Direction


@dataclass(frozen=True)
class LineCount:
    """Crossings of one line so far: ``forward`` (``in``) and ``backward`` (``out``), in all
    and per label."""

    name: str
    forward: int
    backward: int
    by_label: tuple[tuple[str, int, int], ...] = ()  # (label, forward, backward)


@dataclass(frozen=True)
class ZoneCount:
    """One zone: tracks inside `now`, distinct tracks that entered (`total`)."""

    name: str
    now: int
    total: int


@dataclass
class LineCounter:
    """Counts crossings of `spec` (see the module text); the dead band each side of the line is
    `margin_px`, or `height_fraction` of the object's box height if more."""

    spec: LineSpec
    margin_px: float = 4.0
    height_fraction: float = 0.1  # the dead band is at least this fraction of the box height
    _sides: dict[int, int] = field(default_factory=dict)  # track id -> settled side, -1 left / +1 right
    _counts: dict[str, list[int]] = field(default_factory=dict)  # label -> [forward, backward]
    _base: tuple[int, int] = (0, 0)  # totals carried over from before (a restart), not per label

    def restore(self, forward: int, backward: int) -> None:
        """Count on from these totals (the ones saved before a restart); `by_label` covers only
        what was counted since."""
        self._base = (forward, backward)

    def reset(self) -> None:
        """Every total back to zero (the tracks' sides are kept: a crossing in progress counts)."""
        self._counts.clear()
        self._base = (0, 0)

    def update(
        self,
        track_ids: npt.NDArray[np.int32],
        points: npt.NDArray[np.float64],
        labels: list[str],
        heights: npt.NDArray[np.floating] | None = None,
    ) -> list[Crossing]:
        """Feed one frame's tracked anchors ``(n, 2)`` (and box heights ``(n,)``, pixels);
        returns the crossings it completed."""
        (x1, y1), (x2, y2) = self.spec.start, self.spec.end
        dx, dy = x2 - x1, y2 - y1
        length2 = dx * dx + dy * dy
        rel = points - np.array([x1, y1])
        distance = (dx * rel[:, 1] - dy * rel[:, 0]) / np.sqrt(length2)  # > 0: right of P1->P2 (y down)
        along = (rel[:, 0] * dx + rel[:, 1] * dy) / length2  # 0 at P1, 1 at P2
        sizes = np.zeros(len(points)) if heights is None else heights
        band = np.maximum(self.margin_px, self.height_fraction * sizes)
        crossings = []
        for track_id, d, t, label, b in zip(
            track_ids.tolist(), distance.tolist(), along.tolist(), labels, band.tolist(), strict=True
        ):
            if abs(d) <= b:
                continue
            side, previous = (1 if d > 0 else -1), self._sides.get(track_id)
            self._sides[track_id] = side
            if previous is None or previous == side or not 0 <= t <= 1:
                continue
            direction: Direction = "forward" if side > 0 else "backward"
            self._counts.setdefault(label, [0, 0])[0 if side > 0 else 1] += 1
            crossings.append(Crossing(self.spec.name, track_id, label, direction))
        return crossings

    def forget(self, track_id: int) -> None:
        self._sides.pop(track_id, None)

    def held(self) -> int:
        """Tracks whose side is remembered."""
        return len(self._sides)

    def count(self) -> LineCount:
        by_label = tuple((label, f, b) for label, (f, b) in sorted(self._counts.items()))
        forward = self._base[0] + sum(f for _, f, _ in by_label)
        backward = self._base[1] + sum(b for _, _, b in by_label)
        return LineCount(self.spec.name, forward, backward, by_label)


@dataclass
class ZoneCounter:
    """Occupancy and dwell time of `spec`; times are the caller's (frame) seconds."""

    spec: ZoneSpec
    _contour: npt.NDArray[np.float32] = field(init=False)
    _entered_at: dict[int, float] = field(default_factory=dict)  # inside now: track id -> time it entered
    _last_inside: dict[int, float] = field(default_factory=dict)  # inside now: last time seen inside
    _dwell: dict[int, float] = field(default_factory=dict)  # finished visits, per live track
    _total: int = 0

    def __post_init__(self) -> None:
        self._contour = np.array(self.spec.polygon, np.float32).reshape(-1, 1, 2)

    def restore(self, total: int) -> None:
        """Count on from this total (the one saved before a restart)."""
        self._total = total

    def reset(self) -> None:
        """The total back to zero (the tracks inside now stay inside, uncounted)."""
        self._total = 0

    def contains(self, point: Point) -> bool:
        return cv2.pointPolygonTest(self._contour, (float(point[0]), float(point[1])), False) >= 0

    def update(
        self, now: float, track_ids: npt.NDArray[np.int32], points: npt.NDArray[np.float64], labels: list[str]
    ) -> list[int]:
        """Feed the anchors of the tracks seen at time `now`; returns the ids that entered."""
        entered = []
        for track_id, point, label in zip(track_ids.tolist(), points.tolist(), labels, strict=True):
            inside = (not self.spec.labels or label in self.spec.labels) and self.contains(point)
            if inside and track_id not in self._entered_at:
                self._entered_at[track_id] = now
                if track_id not in self._dwell:
                    self._total += 1
                entered.append(track_id)
            if inside:
                self._last_inside[track_id] = now
            elif track_id in self._entered_at:
                self._leave(track_id, now)
        return entered

    def _leave(self, track_id: int, at: float) -> None:
        self._dwell[track_id] = self._dwell.get(track_id, 0.0) + at - self._entered_at.pop(track_id)
        self._last_inside.pop(track_id, None)

    def visited(self, track_id: int) -> bool:
        """Whether the (live) track has been inside."""
        return track_id in self._entered_at or track_id in self._dwell

    def dwell_s(self, track_id: int) -> float:
        """Seconds the track has spent inside, its current visit up to its last frame inside."""
        current = self._last_inside.get(track_id, 0.0) - self._entered_at.get(track_id, 0.0)
        return self._dwell.get(track_id, 0.0) + current

    def forget(self, track_id: int) -> float | None:
        """The track ended (at its last frame seen): its dwell in seconds (None if it never
        entered); its state is dropped."""
        if track_id in self._entered_at:
            self._leave(track_id, self._last_inside[track_id])
        return self._dwell.pop(track_id, None)

    def held(self) -> int:
        """Tracks with state here (inside now, or visited and still alive)."""
        return len(self._entered_at.keys() | self._dwell.keys() | self._last_inside.keys())

    def count(self, alive: Collection[int] | None = None) -> ZoneCount:
        inside = self._entered_at if alive is None else [t for t in self._entered_at if t in alive]
        return ZoneCount(self.spec.name, len(inside), self._total)
