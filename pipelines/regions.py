"""Regions for high-resolution cameras (issue 39, docs/cameras.md "Regions"): which parts of a
frame to infer, and the crops' detections back in frame pixels. Pure: no I/O, no threads, the
clock is the caller's ``now``.

A 1920x1080 frame letterboxed into a 640 input is shrunk to a third: a person 60 pixels tall far
away is 20 pixels in the input, at the edge of what a small model finds. Where the motion gate
(`pipelines.gating`) admits a frame with motion, `plan_crops` turns its motion regions (frame
pixels) into at most `MAX_CROPS` square crops of at least the model's input size:

- regions are merged when they overlap, lie within `MERGE_GAP` pixels, or fit together in one
  square of the input's side (one inference sees them both at full resolution);
- each merged region is squared around its centre, grown to the input's side (so the letterbox
  never enlarges a crop: at most 1:1), and shifted, not cut, to lie inside the frame;
- a region larger than the frame's shorter side (its crop would be shrunk about as much as the
  whole frame), more than `MAX_CROPS` crops, a frame not larger than the input, or no region at
  all: one full-frame pass instead (None).

The model runs on each crop as on a smaller image (the detector's own letterbox), and
`merge_crop_detections` maps its boxes back (the crop's offset; the letterbox's scale is undone
by the detector), drops the duplicates of an object two crops see, and runs class-aware NMS.
A box cut by a crop's edge that is not the frame's edge (``EDGE_PX``) is **dropped when another
crop sees the same object uncut** (of the same class, covering at least `COVERED` of the cut
box), and **kept otherwise**: the uncut box is the better one where there is one, and where
there is none (a still object reaching into a crop) a cut box is still the object, in its place,
and the next full-frame pass (`RegionSchedule`) gives its whole box back. `carry_over` keeps the
previous frame's detections that lie outside every crop: nothing moved there, so what was seen
there stands (as the gate itself hands on a still frame with the last detections).

`RegionSchedule` decides per admitted frame: crops while there is motion, a full frame at least
every `full_frame_interval_s` seconds and whenever the gate admits a frame without motion (the
first frame, the idle interval, a keepalive, a lighting change, motion just ended).

Only for box detectors (task ``detect``): a mask, keypoints or an oriented box would need more
than an offset to map back; the pipeline runs other tasks on full frames.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections
from pipelines.decoding.nms import nms_indices
from pipelines.motion import Motion, merge_boxes

#: most crops one frame is inferred on; more regions than this: one full-frame pass
MAX_CROPS = 4
#: regions closer than this many frame pixels (on both axes) are merged into one crop
MERGE_GAP = 32
#: a box edge within this many pixels of a crop's inner edge is cut by it
EDGE_PX = 2.0
#: a cut box is dropped when an uncut box of its class from another crop covers this share of it
COVERED = 0.5
#: default most seconds between two full-frame passes while crops are inferred (agent.yaml's)
FULL_FRAME_INTERVAL_S = 2.0


@dataclass(frozen=True)
class Crop:
    """A rectangle of the frame inferred on its own: integer frame pixels, ``x1 <= x < x2``,
    ``y1 <= y < y2`` (so ``image[y1:y2, x1:x2]``), square unless the frame is smaller."""

    x1: int
    y1: int
    x2: int
    y2: int

    def __post_init__(self) -> None:
        if not (0 <= self.x1 < self.x2 and 0 <= self.y1 < self.y2):
            raise ValueError(f"crop: expected 0 <= x1 < x2 and 0 <= y1 < y2, got {self.xyxy}")

    @property
    def xyxy(self) -> tuple[int, int, int, int]:
        return self.x1, self.y1, self.x2, self.y2

    def cut(self, image: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        """The crop's pixels of a BGR ``(H, W, 3) uint8`` frame (a view, no copy)."""
        return image[self.y1 : self.y2, self.x1 : self.x2]

    def to_frame(self, detections: Detections) -> Detections:
        """`detections` in this crop's pixels -> the frame's pixels (its offset added)."""
        offset = np.asarray([self.x1, self.y1, self.x1, self.y1], np.float32)
        return Detections.from_arrays(detections.xyxy + offset, detections.confidence, detections.class_id)


def _square(box: tuple[int, int, int, int], side_min: int, frame_hw: tuple[int, int]) -> Crop | None:
    """The square crop around `box`, at least `side_min` on a side, shifted inside the frame;
    None when it cannot fit (larger than the frame's shorter side)."""
    h, w = frame_hw
    side = max(box[2] - box[0], box[3] - box[1], side_min)
    if side > min(h, w):
        return None
    x1 = min(max(0, (box[0] + box[2] - side) // 2), w - side)
    y1 = min(max(0, (box[1] + box[3] - side) // 2), h - side)
    return Crop(x1, y1, x1 + side, y1 + side)


def input_side(input_hw: tuple[int, int]) -> int:
    """The side of a square crop the letterbox takes at 1:1: the input's shorter side, pixels."""
    return min(input_hw)


def plan_crops(
    regions: npt.NDArray[np.float32],
    frame_hw: tuple[int, int],
    input_hw: tuple[int, int],
    max_crops: int = MAX_CROPS,
    gap: int = MERGE_GAP,
) -> tuple[Crop, ...] | None:
    """The crops to infer for motion `regions` ``(n, 4) float32`` xyxy in frame pixels, on a
    frame of `frame_hw` (height, width) pixels and a model input of `input_hw` (height, width):
    at most `max_crops`, largest region first; None for one full-frame pass (see the module)."""
    h, w = frame_hw
    side = input_side(input_hw)
    if len(regions) == 0 or side >= min(h, w):
        return None
    boxes = [
        (max(0, math.floor(x1)), max(0, math.floor(y1)), min(w, math.ceil(x2)), min(h, math.ceil(y2)))
        for x1, y1, x2, y2 in np.asarray(regions, np.float64).reshape(-1, 4)
    ]
    # merged when close, or when one crop of the input's side sees them both at 1:1
    merged = merge_boxes([b for b in boxes if b[2] > b[0] and b[3] > b[1]], gap, side)
    if not merged or len(merged) > max_crops:
        return None
    merged.sort(key=lambda b: (b[2] - b[0]) * (b[3] - b[1]), reverse=True)
    crops = [_square(box, side, frame_hw) for box in merged]
    if any(crop is None for crop in crops):
        return None
    return tuple(crop for crop in crops if crop is not None)


def _cut(xyxy: npt.NDArray[np.float32], crop: Crop, frame_hw: tuple[int, int]) -> npt.NDArray[np.bool_]:
    """``(n,)``: the boxes (frame pixels) that touch an edge of `crop` which is not the frame's."""
    h, w = frame_hw
    cut = np.zeros(len(xyxy), np.bool_)
    if crop.x1 > 0:
        cut |= xyxy[:, 0] <= crop.x1 + EDGE_PX
    if crop.y1 > 0:
        cut |= xyxy[:, 1] <= crop.y1 + EDGE_PX
    if crop.x2 < w:
        cut |= xyxy[:, 2] >= crop.x2 - EDGE_PX
    if crop.y2 < h:
        cut |= xyxy[:, 3] >= crop.y2 - EDGE_PX
    return cut


def _covered(box: npt.NDArray[np.float32], others: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """``(m,)``: the share of `box`'s area ``(4,)`` that each of `others` ``(m, 4)`` covers."""
    iw = np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0])
    ih = np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1])
    area = max(float((box[2] - box[0]) * (box[3] - box[1])), 1e-6)
    return np.asarray(np.maximum(iw, 0) * np.maximum(ih, 0) / area, np.float32)


def _concat(parts: Sequence[Detections]) -> Detections:
    if not parts:
        return Detections.empty()
    return Detections.from_arrays(
        np.concatenate([p.xyxy for p in parts]).reshape(-1, 4),
        np.concatenate([p.confidence for p in parts]),
        np.concatenate([p.class_id for p in parts]),
    )


def merge_crop_detections(
    per_crop: Sequence[tuple[Crop, Detections]], frame_hw: tuple[int, int], iou: float, max_det: int
) -> Detections:
    """One frame's detections from its crops': each `Detections` in its `Crop`'s pixels (boxes
    only), mapped to the frame's; a box cut by an inner crop edge dropped where another crop
    sees its object uncut (see the module); then class-aware NMS at `iou`, at most `max_det`,
    highest confidence first. Boxes ``(n, 4) float32`` xyxy in frame pixels."""
    mapped = [crop.to_frame(detections) for crop, detections in per_crop]
    cuts = [_cut(d.xyxy, crop, frame_hw) for (crop, _), d in zip(per_crop, mapped, strict=True)]
    owner = (
        np.concatenate([np.full(len(d), i, np.intp) for i, d in enumerate(mapped)]) if mapped else np.zeros(0, np.intp)
    )
    every = _concat(mapped)
    cut = np.concatenate(cuts) if cuts else np.zeros(0, np.bool_)
    keep = np.ones(len(every), np.bool_)
    for i in np.flatnonzero(cut):
        whole = (~cut) & (owner != owner[i]) & (every.class_id == every.class_id[i])
        if whole.any() and (_covered(every.xyxy[i], every.xyxy[whole]) >= COVERED).any():
            keep[i] = False
    kept = every[keep]
    if len(kept) == 0:
        return kept
    return kept[nms_indices(kept.xyxy, kept.confidence, iou, max_det, kept.class_id)]


def carry_over(detections: Detections, previous: Detections, crops: Sequence[Crop], max_det: int) -> Detections:
    """`detections` (the crops', frame pixels) with those of `previous` (the frame before's)
    that touch no crop: nothing moved there, so they stand. At most `max_det`, best first."""
    if len(previous) == 0:
        return detections
    xyxy = previous.xyxy
    outside = np.ones(len(previous), np.bool_)
    for crop in crops:
        outside &= (xyxy[:, 2] <= crop.x1) | (xyxy[:, 0] >= crop.x2) | (xyxy[:, 3] <= crop.y1) | (xyxy[:, 1] >= crop.y2)
    both = _concat([detections, previous[outside]])
    return both[np.argsort(-both.confidence, kind="stable")[:max_det]]


class RegionSchedule:
    """One camera's choice, per frame the gate admits, between crops and a full frame:
    crops while there is motion, a full frame at least every `full_frame_interval_s` (> 0)
    seconds of the caller's clock and whenever the frame has no motion. Counts `full_frames`,
    `crop_frames` and `crops`. Not thread-safe: the camera's thread that asks the gate asks it."""

    def __init__(self, full_frame_interval_s: float = FULL_FRAME_INTERVAL_S, max_crops: int = MAX_CROPS) -> None:
        if not full_frame_interval_s > 0:
            raise ValueError(f"full_frame_interval_s: expected > 0 seconds, got {full_frame_interval_s}")
        if max_crops < 1:
            raise ValueError(f"max_crops: expected at least 1, got {max_crops}")
        self.full_frame_interval_s, self.max_crops = full_frame_interval_s, max_crops
        self._last_full: float | None = None
        self.full_frames = self.crop_frames = self.crops = 0

    def plan(
        self, now: float, motion: Motion | None, frame_hw: tuple[int, int], input_hw: tuple[int, int]
    ) -> tuple[Crop, ...] | None:
        """The crops to infer for the frame admitted at `now` (seconds, never decreasing) with
        `motion` (None: unknown); None: a full-frame pass."""
        due = self._last_full is None or now - self._last_full >= self.full_frame_interval_s
        crops = None
        if not due and motion is not None and motion.moving:
            crops = plan_crops(motion.regions, frame_hw, input_hw, self.max_crops)
        if crops is None:
            self._last_full = now
            self.full_frames += 1
            return None
        self.crop_frames += 1
        self.crops += len(crops)
        return crops
