"""Precision and recall of detections against ground truth, at an IoU threshold.

Matching is greedy per class, highest confidence first (as in PASCAL VOC). Ground-truth boxes
marked `ignore` (e.g. shapes mostly hidden behind others) count neither as missed nor, when a
detection matches them, as false positives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections
from pipelines.decoding.nms import box_iou
from pipelines.sources.synthetic import SyntheticScene


@dataclass
class MatchCounts:
    """Running totals over frames."""

    true_positives: int = 0
    false_positives: int = 0
    false_negatives: int = 0

    @property
    def precision(self) -> float:
        found = self.true_positives + self.false_positives
        return self.true_positives / found if found else 1.0

    @property
    def recall(self) -> float:
        wanted = self.true_positives + self.false_negatives
        return self.true_positives / wanted if wanted else 1.0

    def add(
        self,
        detections: Detections,
        truth: Detections,
        ignore: npt.NDArray[np.bool_] | None = None,
        iou_threshold: float = 0.5,
    ) -> None:
        """Match one frame's detections to its ground truth and add to the totals."""
        ignore = np.zeros(len(truth), bool) if ignore is None else ignore
        matched = np.zeros(len(truth), bool)
        for _, j in match(detections, truth, iou_threshold):
            matched[j] = True
            self.true_positives += int(not ignore[j])
        self.false_positives += len(detections) - int(matched.sum())
        self.false_negatives += int((~matched & ~ignore).sum())


def match(detections: Detections, truth: Detections, iou_threshold: float = 0.5) -> list[tuple[int, int]]:
    """Pairs (detection index, truth index): each detection, most confident first, takes the
    unmatched truth box of its class it overlaps most, if at IoU >= `iou_threshold`."""
    taken = np.zeros(len(truth), bool)
    pairs = []
    for i in np.argsort(-detections.confidence, kind="stable"):
        same_class = np.flatnonzero((truth.class_id == detections.class_id[i]) & ~taken)
        if same_class.size:
            ious = box_iou(detections.xyxy[i], truth.xyxy[same_class])
            best = int(np.argmax(ious))
            if ious[best] >= iou_threshold:
                taken[same_class[best]] = True
                pairs.append((int(i), int(same_class[best])))
    return pairs


#: scene seeds at or above this are never used for training the demo model
HELD_OUT_SEED = 100_000


def evaluate_on_synthetic(
    detect: Callable[[npt.NDArray[Any]], Detections],
    scenes: int = 4,
    frames_per_scene: int = 50,
    min_visible: float = 0.5,
    iou_threshold: float = 0.5,
) -> MatchCounts:
    """Precision/recall of `detect` on a held-out synthetic clip (640x480, five shapes a scene,
    every 7th frame). Shapes less than `min_visible` visible are ignored."""
    counts = MatchCounts()
    for s in range(scenes):
        scene = SyntheticScene(seed=HELD_OUT_SEED + s, num_shapes=5)
        for i in range(frames_per_scene):
            image, truth = scene.render(i * 7)
            counts.add(detect(image), truth.detections, truth.visible < min_visible, iou_threshold)
    return counts


@dataclass(frozen=True)
class TrackingFrame:
    """One frame of a tracking evaluation, in the form CLEAR-MOT evaluators take
    (py-motmetrics' ``MOTAccumulator.update``): ground-truth ids, hypothesis (track) ids, and
    ``distances (len(truth_ids), len(track_ids))``: ``1 - IoU``, NaN where IoU < the threshold."""

    truth_ids: list[int]
    track_ids: list[int]
    distances: npt.NDArray[np.float64]


def tracking_frame(
    truth: Detections,
    truth_ids: npt.NDArray[np.int32],
    ignore: npt.NDArray[np.bool_],
    tracked: Detections,
    iou_threshold: float = 0.5,
) -> TrackingFrame:
    """Compare one frame's confirmed tracks (`tracked`, `tracker_id` >= 0) with the truth.

    Ground truth marked `ignore` (mostly hidden or out of the frame) is left out, and so is a
    track box lying mostly (over half its area) inside such an object's box unless it matches
    a kept object better: a detector may or may not see the visible sliver of a hidden shape,
    and neither is an error (as MOTChallenge does with its distractor classes)."""
    from pipelines.tracking.tracker import pairwise_iou

    if tracked.tracker_id is None:
        raise ValueError("tracking_frame needs detections with tracker_id (run a tracker first)")
    hyp = tracked[tracked.tracker_id >= 0]
    kept = truth[~ignore]
    if len(hyp) and ignore.any():
        hidden = truth.xyxy[ignore]
        x1 = np.maximum(hyp.xyxy[:, None, 0], hidden[None, :, 0])
        y1 = np.maximum(hyp.xyxy[:, None, 1], hidden[None, :, 1])
        x2 = np.minimum(hyp.xyxy[:, None, 2], hidden[None, :, 2])
        y2 = np.minimum(hyp.xyxy[:, None, 3], hidden[None, :, 3])
        area = np.maximum((hyp.xyxy[:, 2] - hyp.xyxy[:, 0]) * (hyp.xyxy[:, 3] - hyp.xyxy[:, 1]), 1e-9)
        inside = (np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None) / area[:, None]).max(axis=1)
        best_kept = pairwise_iou(hyp.xyxy, kept.xyxy).max(axis=1) if len(kept) else np.zeros(len(hyp))
        hyp = hyp[~((inside > 0.5) & (best_kept < iou_threshold))]
    iou = pairwise_iou(kept.xyxy, hyp.xyxy)
    track_ids = [] if hyp.tracker_id is None else hyp.tracker_id.tolist()
    return TrackingFrame(truth_ids[~ignore].tolist(), track_ids, np.where(iou >= iou_threshold, 1 - iou, np.nan))
