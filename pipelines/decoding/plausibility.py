"""The plausibility guard: detections no fitting decoder could produce.

A decoder that does not fit its model still returns numbers: an end-to-end model read as
YOLOv5 multiplies a score by a class id and prints "person 12.84". After decoding, the guard
looks for what is impossible:

- scores outside [0, 1] (a small tolerance for float and quantization rounding);
- most boxes inverted (``x2 < x1`` or ``y2 < y1``), not finite, or mostly outside the input
  (less than a quarter of the box inside);
- on a blank frame, more than ``max_det`` detections surviving NMS;
- for task models: keypoint scores outside [0, 1] or keypoints not finite; most oriented boxes
  of no size, not finite or larger than the input many times over; mask coefficients not finite
  or beyond `MAX_COEFFICIENT` (a decoder reading class scores or boxes as coefficients).

`problems` and `blank_frame_problems` return what looked wrong as short phrases (empty when
plausible); the `Detector` turns them into errors naming the output shapes. Pure functions.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections

#: scores this far outside [0, 1] still count as inside (rounding, int8 steps of 1/255)
SCORE_TOLERANCE = 0.01
#: more than this share of bad boxes makes the detections implausible
BAD_BOX_SHARE = 0.5
#: a box with less than this share of its area inside the input counts as outside (a decoder that
#: does not fit throws boxes far off; a fitting one keeps them on the letterboxed input)
INSIDE_SHARE = 0.25
#: an oriented box whose side is longer than this many input diagonals is impossible
MAX_SIDE_DIAGONALS = 4.0
#: mask coefficients beyond this are not a segmentation head's (they are logits of moderate size)
MAX_COEFFICIENT = 1e4


def _inside_share(xyxy: npt.NDArray[np.float32], input_hw: tuple[int, int]) -> npt.NDArray[np.float32]:
    """Per box, the share of its area inside the ``input_hw`` frame; for a box of no area, 1.0
    when its centre is inside, else 0.0."""
    h, w = input_hw
    iw = np.clip(np.minimum(xyxy[:, 2], w) - np.maximum(xyxy[:, 0], 0), 0, None)
    ih = np.clip(np.minimum(xyxy[:, 3], h) - np.maximum(xyxy[:, 1], 0), 0, None)
    area = (xyxy[:, 2] - xyxy[:, 0]) * (xyxy[:, 3] - xyxy[:, 1])
    cx, cy = (xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2
    centre_in = ((cx >= 0) & (cx <= w) & (cy >= 0) & (cy <= h)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(area > 0, iw * ih / np.where(area > 0, area, 1.0), centre_in)
    return np.asarray(share, np.float32)


def problems(detections: Detections, input_hw: tuple[int, int]) -> list[str]:
    """What is impossible about decoded `detections` (input-tensor pixels of an ``input_hw``
    = (height, width) input, before NMS); an empty list when they are plausible."""
    n = len(detections)
    if n == 0:
        return []
    found = []
    scores = detections.confidence
    bad_scores = ~np.isfinite(scores) | (scores < -SCORE_TOLERANCE) | (scores > 1 + SCORE_TOLERANCE)
    if bad_scores.any():
        finite = scores[np.isfinite(scores)]
        span = f" (from {finite.min():.4g} to {finite.max():.4g})" if finite.size else ""
        found.append(f"{int(bad_scores.sum())} of {n} scores outside [0, 1]{span}")
    xyxy = detections.xyxy
    finite_boxes = np.isfinite(xyxy).all(axis=1)
    safe = np.nan_to_num(xyxy, nan=0.0, posinf=0.0, neginf=0.0)
    slack = 1e-3 * max(1.0, float(np.abs(safe).max()))
    inverted = finite_boxes & ((safe[:, 2] < safe[:, 0] - slack) | (safe[:, 3] < safe[:, 1] - slack))
    outside = finite_boxes & ~inverted & (_inside_share(safe, input_hw) < INSIDE_SHARE)
    bad = int((~finite_boxes | inverted | outside).sum())
    if bad > BAD_BOX_SHARE * n:
        h, w = input_hw
        parts = [
            f"{count} {what}"
            for count, what in (
                (int(inverted.sum()), "inverted (x2 < x1 or y2 < y1)"),
                (int(outside.sum()), f"mostly outside the {w}x{h} input"),
                (int((~finite_boxes).sum()), "not finite"),
            )
            if count
        ]
        found.append(f"{bad} of {n} boxes are wrong: " + ", ".join(parts))
    return found + task_problems(detections, input_hw)


def task_problems(detections: Detections, input_hw: tuple[int, int]) -> list[str]:
    """What is impossible about the keypoints, oriented boxes and mask coefficients of
    `detections` (input pixels); empty when plausible or when they carry none."""
    found = []
    n = len(detections)
    kpts = detections.keypoints
    if kpts is not None and n:
        if not np.isfinite(kpts).all():
            found.append(
                f"{int((~np.isfinite(kpts)).any(axis=(1, 2)).sum())} of {n} detections have keypoints not finite"
            )
        elif kpts.shape[2] == 3:
            scores = kpts[..., 2]
            bad = (scores < -SCORE_TOLERANCE) | (scores > 1 + SCORE_TOLERANCE)
            if bad.any():
                found.append(
                    f"{int(bad.sum())} keypoint scores outside [0, 1] (from {scores.min():.4g} to {scores.max():.4g})"
                )
    if detections.xywhr is not None and n:
        sides = detections.xywhr[:, 2:4]
        limit = MAX_SIDE_DIAGONALS * float(np.hypot(*input_hw))
        finite = np.isfinite(detections.xywhr).all(axis=1)
        wrong = ~finite | (np.nan_to_num(sides, nan=0.0) <= 0).any(axis=1) | (np.nan_to_num(sides) > limit).any(axis=1)
        if wrong.sum() > BAD_BOX_SHARE * n:
            found.append(
                f"{int(wrong.sum())} of {n} oriented boxes are of no size, not finite or longer than "
                f"{MAX_SIDE_DIAGONALS:g} input diagonals"
            )
    if detections.masks is not None and n:
        coefficients = detections.masks.coefficients
        bad = ~np.isfinite(coefficients) | (np.abs(np.nan_to_num(coefficients)) > MAX_COEFFICIENT)
        if bad.any():
            found.append(
                f"{int(bad.any(axis=1).sum())} of {n} detections have mask coefficients not finite "
                f"or beyond {MAX_COEFFICIENT:g}"
            )
    return found


def blank_frame_problems(survivors: int, max_det: int) -> list[str]:
    """A blank (uniform black) frame holds no objects: more than `max_det` detections surviving
    NMS on one means the decoder reads noise as objects."""
    if survivors > max_det:
        return [f"{survivors} detections survive on a blank frame, more than max_det {max_det}"]
    return []
