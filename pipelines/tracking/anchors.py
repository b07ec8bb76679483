"""The point of a tracked object that a counting line or a zone tests, chosen to fit the task.

An anchor is written as text in agent.yaml (a camera's ``anchor`` or one line's / zone's):

- ``center``: the box centre (every task; for an oriented box, its own centre from ``xywhr``,
  which is also the centre of the axis-aligned box around it);
- ``bottom_center``: the middle of the box's bottom edge, where a person or a vehicle touches
  the ground;
- ``obb_center``: the oriented box's centre ``xywhr[:, :2]`` (the raw detection's, not the
  Kalman-filtered box's); the box centre for detections without oriented boxes;
- ``keypoints:I,J,...``: the mean of those keypoints (pose; ``keypoints:15,16`` is the ankles'
  midpoint on COCO's 17), over the ones whose score is at least `KEYPOINT_MIN_SCORE`; when none
  of them is, or the detections carry no keypoints, the middle of the box's bottom edge.

`anchor_points(anchor, boxes, detections)` gives the ``(n, 2)`` points, in the pixels of the
boxes (source-frame pixels), ``x`` right, ``y`` down. Pure functions of frozen values: any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections

AnchorKind = Literal["center", "bottom_center", "obb_center", "keypoints"]

#: a keypoint below this score (0..1) is not used for an anchor
KEYPOINT_MIN_SCORE = 0.5

_PLAIN: tuple[AnchorKind, ...] = ("center", "bottom_center", "obb_center")


@dataclass(frozen=True)
class AnchorSpec:
    """An anchor: its `kind`, and for ``keypoints`` the keypoint indices (0-based) averaged."""

    kind: AnchorKind = "center"
    keypoints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if (self.kind == "keypoints") != bool(self.keypoints):
            raise ValueError(
                f"anchor {self.kind!r}: keypoint indices are for 'keypoints:I,J' only, got {self.keypoints}"
            )
        if any(k < 0 for k in self.keypoints):
            raise ValueError(f"anchor keypoints: indices start at 0, got {self.keypoints}")

    def __str__(self) -> str:
        if self.kind == "keypoints":
            return "keypoints:" + ",".join(str(k) for k in self.keypoints)
        return self.kind


def parse_anchor(text: str) -> AnchorSpec:
    """``center``, ``bottom_center``, ``obb_center`` or ``keypoints:I,J,...`` as an `AnchorSpec`;
    a `ValueError` naming what is wrong otherwise (no I/O: config validators call it)."""
    word = text.strip()
    if word in _PLAIN:
        return AnchorSpec(word)
    if word.startswith("keypoints:"):
        parts = [p.strip() for p in word.removeprefix("keypoints:").split(",")]
        if not parts or not all(p.isdigit() for p in parts):
            raise ValueError(
                f"anchor {text!r}: keypoints:I,J,... takes keypoint indices 0, 1, 2, ... (e.g. keypoints:15,16)"
            )
        return AnchorSpec("keypoints", tuple(int(p) for p in parts))
    raise ValueError(
        f"anchor {text!r}: expected center, bottom_center, obb_center or keypoints:I,J,... (e.g. keypoints:15,16)"
    )


def _box_points(boxes: npt.NDArray[np.float64], bottom: bool) -> npt.NDArray[np.float64]:
    x = (boxes[:, 0] + boxes[:, 2]) / 2
    y = boxes[:, 3] if bottom else (boxes[:, 1] + boxes[:, 3]) / 2
    return np.stack([x, y], axis=1)


def anchor_points(
    anchor: AnchorSpec, boxes: npt.NDArray[np.float32], detections: Detections | None = None
) -> npt.NDArray[np.float64]:
    """``(n, 2) float64`` anchor points of ``(n, 4)`` xyxy `boxes` (the tracks' filtered boxes);
    `detections` (the same ``n`` rows) give the keypoints and oriented boxes when the anchor
    needs them. A keypoint index beyond the model's K raises a `ValueError` naming both."""
    xyxy = np.asarray(boxes, np.float64).reshape(-1, 4)
    if anchor.kind == "center":
        return _box_points(xyxy, bottom=False)
    if anchor.kind == "bottom_center":
        return _box_points(xyxy, bottom=True)
    if anchor.kind == "obb_center":
        if detections is None or detections.xywhr is None:
            return _box_points(xyxy, bottom=False)
        return np.asarray(detections.xywhr[:, :2], np.float64).reshape(-1, 2)
    points = _box_points(xyxy, bottom=True)
    kpts = None if detections is None else detections.keypoints
    if kpts is None or len(xyxy) == 0:
        return points
    k = kpts.shape[1]
    if max(anchor.keypoints) >= k:
        raise ValueError(f"anchor {anchor}: the model has {k} keypoints (0..{k - 1})")
    chosen = np.asarray(kpts[:, list(anchor.keypoints), :], np.float64)  # (n, j, 2 or 3)
    seen = chosen[:, :, 2] >= KEYPOINT_MIN_SCORE if chosen.shape[2] == 3 else np.ones(chosen.shape[:2], bool)
    counted = seen.sum(axis=1)
    sums = (chosen[:, :, :2] * seen[:, :, None]).sum(axis=1)
    have = counted > 0
    points[have] = sums[have] / counted[have, None]
    return points
