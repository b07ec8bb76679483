"""Multi-object tracking after NMS: a ByteTrack-style tracker (Zhang et al., 2022).

Each track carries a constant-velocity Kalman filter over ``(cx, cy, aspect, height)``. A frame
is associated in three rounds, all by IoU with the Hungarian method (`scipy.optimize`):

1. confirmed and lost tracks (predicted forward) with the confident detections
   (``score >= high_score``);
2. confirmed tracks still unmatched with the low-score detections (``low_score <= score <
   high_score``), so an object that fades (occluded, blurred) keeps its track instead of
   spawning a new one;
3. tentative tracks (seen once) with the confident detections left; a tentative track that
   misses its second frame is dropped, one matched is confirmed and gets the next id.

A confirmed track that misses a frame becomes lost; it keeps its id and is found again in
round 1 for up to `lost_frames` frames (its Kalman prediction keeps moving meanwhile), then it
ends. Association ignores the class, as ByteTrack's does (a detector that hesitates between
two classes on a half-hidden object must not split its track), unless `class_aware`.

Why our own code rather than supervision's or norfair's tracker: docs/analytics.md.

Threads: a `ByteTracker` is not thread-safe; one camera's frames reach it in order from that
camera's inference thread (the pipeline's sinks). Invariants: ids are 1, 2, 3, ... per tracker,
never reused; every track ends exactly once (`TrackerStep.ended`), ``reset`` ends them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections
from pipelines.tracking.kalman import KalmanBoxFilter, to_xyah, to_xyxy


@dataclass(frozen=True)
class TrackerSettings:
    """Scores in 0..1; `*_iou` are the least IoU of a match per round; `lost_frames` frames a
    lost track is kept for (at 15 FPS, 30 frames = 2 s)."""

    high_score: float = 0.5
    low_score: float = 0.1
    new_track_score: float = 0.6
    match_iou: float = 0.2
    low_match_iou: float = 0.5
    tentative_iou: float = 0.3
    lost_frames: int = 30
    class_aware: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.low_score <= self.high_score <= 1:
            raise ValueError(f"tracker scores must be 0 <= low_score <= high_score <= 1, got {self}")
        if self.lost_frames < 0:
            raise ValueError(f"lost_frames must be >= 0, got {self.lost_frames}")


@dataclass
class _Track:
    mean: npt.NDArray[np.float64]  # (8,) Kalman state
    cov: npt.NDArray[np.float64]  # (8, 8)
    class_id: int
    score: float
    track_id: int = 0  # 0 while tentative
    missed: int = 0  # frames since the last match
    #: xyxy where the last inferred frame left it, while it coasts (`ByteTracker.coast`); else None
    seen: npt.NDArray[np.float64] | None = None


@dataclass(frozen=True)
class TrackerStep:
    """One frame's result: the detections with `tracker_id` set (``-1``: no confirmed track),
    the ids confirmed this frame (`started`), the ids that ended (lost too long), and
    `filtered` ``(n, 4) float32``: each detection's box as its track's Kalman filter now has it
    (steadier than the detection; the detection's own box where no track owns it)."""

    detections: Detections
    started: tuple[int, ...] = ()
    ended: tuple[int, ...] = ()
    filtered: npt.NDArray[np.float32] | None = None


def pairwise_iou(a: npt.NDArray[np.floating], b: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
    """IoU of every xyxy box of ``a (n, 4)`` with every one of ``b (m, 4)``: ``(n, m)``."""
    a64, b64 = np.asarray(a, np.float64)[:, None, :], np.asarray(b, np.float64)[None, :, :]
    w = np.clip(np.minimum(a64[..., 2], b64[..., 2]) - np.maximum(a64[..., 0], b64[..., 0]), 0, None)
    h = np.clip(np.minimum(a64[..., 3], b64[..., 3]) - np.maximum(a64[..., 1], b64[..., 1]), 0, None)
    inter = w * h
    area_a = (a64[..., 2] - a64[..., 0]) * (a64[..., 3] - a64[..., 1])
    area_b = (b64[..., 2] - b64[..., 0]) * (b64[..., 3] - b64[..., 1])
    union = area_a + area_b - inter
    iou: npt.NDArray[np.float64] = np.where(union > 0, inter / np.maximum(union, 1e-9), 0.0)
    return iou


def match(
    tracks: list[_Track],
    boxes: npt.NDArray[np.float32],
    classes: npt.NDArray[np.int32],
    min_iou: float,
    class_aware: bool = False,
) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    """Hungarian matching of `tracks` (by predicted box) to `boxes` (of the same class when
    `class_aware`) with IoU >= `min_iou`; returns ``(pairs (track index, box index), unmatched
    tracks, unmatched boxes)``. A track that coasted since it was last seen is matched by the
    better of its predicted box and the box it was last seen at: the frames it coasted over had
    no motion, so an object that stopped is still where it was, while its filter, whose
    velocity had not yet settled to zero, predicted it on."""
    if not tracks or len(boxes) == 0:
        return [], list(range(len(tracks))), list(range(len(boxes)))
    predicted = to_xyxy(np.stack([t.mean[:4] for t in tracks]))
    iou = pairwise_iou(predicted, boxes)
    for row, track in enumerate(tracks):
        if track.seen is not None:
            iou[row] = np.maximum(iou[row], pairwise_iou(track.seen[None, :], boxes)[0])
    if class_aware:
        iou[np.array([t.class_id for t in tracks])[:, None] != classes[None, :]] = 0.0
    # imported here: scipy.optimize is a third of what the daemon imports at start (every agent,
    # cameras that track or not), and only a camera with tracks to match needs it
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(-iou)
    pairs = [(int(r), int(c)) for r, c in zip(rows, cols, strict=True) if iou[r, c] >= min_iou]
    matched_rows, matched_cols = {r for r, _ in pairs}, {c for _, c in pairs}
    return (
        pairs,
        [i for i in range(len(tracks)) if i not in matched_rows],
        [j for j in range(len(boxes)) if j not in matched_cols],
    )


@dataclass
class ByteTracker:
    """Tracks across the frames of one camera; call `update` once per frame, in order."""

    settings: TrackerSettings = field(default_factory=TrackerSettings)
    _kalman: KalmanBoxFilter = field(default_factory=KalmanBoxFilter)
    _tracks: list[_Track] = field(default_factory=list)  # confirmed: tracked and lost
    _tentative: list[_Track] = field(default_factory=list)
    _next_id: int = 1
    _filtered: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros((0, 4), np.float32))

    @property
    def confirmed(self) -> int:
        """How many tracks were confirmed so far (ids are 1..confirmed)."""
        return self._next_id - 1

    @property
    def active_ids(self) -> list[int]:
        """Ids of the confirmed tracks alive now (tracked or lost), oldest first."""
        return [t.track_id for t in self._tracks]

    def update(self, detections: Detections) -> TrackerStep:
        """Associate one frame's detections (after NMS) with the tracks; see the module text."""
        s = self.settings
        ids = np.full(len(detections), -1, np.int32)
        self._filtered = detections.xyxy.copy()
        self._predict(self._tracks + self._tentative)  # every track's `missed` + 1
        conf = detections.confidence
        high = np.flatnonzero(conf >= s.high_score)
        low = np.flatnonzero((conf >= s.low_score) & (conf < s.high_score))

        rest_tracks, high = self._associate(self._tracks, detections, high, s.match_iou, ids)
        was_tracked = [t for t in rest_tracks if t.missed == 1]  # matched last frame
        self._associate(was_tracked, detections, low, s.low_match_iou, ids)

        pairs, _, rest = match(
            self._tentative, detections.xyxy[high], detections.class_id[high], s.tentative_iou, s.class_aware
        )
        started: list[int] = []
        for t, _ in pairs:
            self._tentative[t].track_id, self._next_id = self._next_id, self._next_id + 1
            started.append(self._tentative[t].track_id)
        self._correct([(self._tentative[t], int(high[b])) for t, b in pairs], detections, ids)
        self._tracks += [self._tentative[t] for t, _ in pairs]
        self._tentative = [self._new_track(detections, int(j)) for j in high[rest] if conf[j] >= s.new_track_score]

        ended = [t.track_id for t in self._tracks if t.missed > s.lost_frames]
        self._tracks = [t for t in self._tracks if t.missed <= s.lost_frames]
        return TrackerStep(detections.with_tracker_id(ids), tuple(started), tuple(ended), self._filtered)

    def coast(self) -> tuple[int, ...]:
        """A frame not inferred (the motion gate: nothing moved enough to look): every track's
        filter predicts one frame on, so the next inferred frame finds a moving track where it
        went, and one that stopped where it was (the box it was last seen at, see `match`); a
        track seen at the last inferred frame is taken as still in view (no miss), one
        missing then stays missing (a miss, so it ends when it would have). Returns the ids that
        ended."""
        tracks = self._tracks + self._tentative
        for track in tracks:
            if track.seen is None:  # the first frame not inferred since it was last corrected
                track.seen = to_xyxy(track.mean[None, :4])[0].astype(np.float64)
        if tracks:
            means, covs = self._kalman.predict(np.stack([t.mean for t in tracks]), np.stack([t.cov for t in tracks]))
            for track, mean, cov in zip(tracks, means, covs, strict=True):
                track.mean, track.cov = mean, cov
                if track.missed:  # missing at the last inferred frame: one frame more
                    track.missed += 1
        ended = tuple(t.track_id for t in self._tracks if t.missed > self.settings.lost_frames)
        self._tracks = [t for t in self._tracks if t.missed <= self.settings.lost_frames]
        return ended

    def reset(self) -> tuple[int, ...]:
        """Forget every track (the camera restarted); returns the ids that ended."""
        ended = tuple(self.active_ids)
        self._tracks, self._tentative = [], []
        return ended

    # -- steps -------------------------------------------------------------------------------

    def _predict(self, tracks: list[_Track]) -> None:
        if not tracks:
            return
        means, covs = self._kalman.predict(np.stack([t.mean for t in tracks]), np.stack([t.cov for t in tracks]))
        for track, mean, cov in zip(tracks, means, covs, strict=True):
            track.mean, track.cov, track.missed = mean, cov, track.missed + 1

    def _associate(
        self,
        tracks: list[_Track],
        detections: Detections,
        candidates: npt.NDArray[np.intp],
        min_iou: float,
        ids: npt.NDArray[np.int32],
    ) -> tuple[list[_Track], npt.NDArray[np.intp]]:
        """Match `tracks` with the detections indexed by `candidates` and correct the matched
        ones; returns the tracks and the candidates left unmatched."""
        pairs, rest_tracks, rest_boxes = match(
            tracks, detections.xyxy[candidates], detections.class_id[candidates], min_iou, self.settings.class_aware
        )
        self._correct([(tracks[t], int(candidates[b])) for t, b in pairs], detections, ids)
        return [tracks[t] for t in rest_tracks], candidates[rest_boxes]

    def _correct(self, pairs: list[tuple[_Track, int]], detections: Detections, ids: npt.NDArray[np.int32]) -> None:
        """Correct each track's filter with its detection (an index) and write its id there."""
        if not pairs:
            return
        tracks, boxes = [t for t, _ in pairs], detections.xyxy[[d for _, d in pairs]]
        means, covs = self._kalman.update(
            np.stack([t.mean for t in tracks]), np.stack([t.cov for t in tracks]), to_xyah(boxes)
        )
        self._filtered[[d for _, d in pairs]] = to_xyxy(means[:, :4])
        for (track, detection), mean, cov in zip(pairs, means, covs, strict=True):
            track.mean, track.cov, track.missed, track.seen = mean, cov, 0, None
            track.score = float(detections.confidence[detection])
            ids[detection] = track.track_id

    def _new_track(self, detections: Detections, index: int) -> _Track:
        mean, cov = self._kalman.initiate(to_xyah(detections.xyxy[index : index + 1])[0])
        return _Track(mean, cov, int(detections.class_id[index]), float(detections.confidence[index]))
