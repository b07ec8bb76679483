"""Oriented boxes: probabilistic IoU, rotated NMS and corners, as pure functions over arrays.

Boxes are ``(n, 5)`` ``cx, cy, w, h, angle`` (pixels, radians). The overlap of two boxes is
their probabilistic IoU (Llerena et al. 2021, arXiv:2106.06072): each box is read as a 2-D
Gaussian with covariance ``R diag(w^2/12, h^2/12) R^T`` and the overlap is ``1 - Hellinger
distance`` of the two, as Ultralytics' ``batch_probiou``. NMS follows Ultralytics' rotated NMS
(its "fast NMS"): within a class, a box is dropped when it overlaps *any* higher-scoring box of
its class above the threshold, even one that was dropped itself. Pairs are computed in blocks of
`BLOCK` rows, so memory stays ``BLOCK x n`` however many candidates come.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

#: rows of the pairwise overlap matrix computed at once
BLOCK = 1024
_EPS = 1e-7


def _covariance(xywhr: npt.NDArray[np.float32]) -> tuple[npt.NDArray[np.float64], ...]:
    """(a, b, c) of each box's covariance ``[[a, c], [c, b]]``."""
    boxes = xywhr.astype(np.float64)
    var_w, var_h = boxes[:, 2] ** 2 / 12, boxes[:, 3] ** 2 / 12
    cos, sin = np.cos(boxes[:, 4]), np.sin(boxes[:, 4])
    return var_w * cos**2 + var_h * sin**2, var_w * sin**2 + var_h * cos**2, (var_w - var_h) * cos * sin


def probiou(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Probabilistic IoU of each of ``(n, 5)`` boxes `a` with each of ``(m, 5)`` boxes `b`: ``(n, m)``."""
    a1, b1, c1 = (v[:, None] for v in _covariance(a))
    a2, b2, c2 = (v[None, :] for v in _covariance(b))
    x1, y1 = a[:, 0, None].astype(np.float64), a[:, 1, None].astype(np.float64)
    x2, y2 = b[None, :, 0].astype(np.float64), b[None, :, 1].astype(np.float64)
    denominator = (a1 + a2) * (b1 + b2) - (c1 + c2) ** 2 + _EPS
    t1 = ((a1 + a2) * (y1 - y2) ** 2 + (b1 + b2) * (x1 - x2) ** 2) / denominator * 0.25
    t2 = ((c1 + c2) * (x2 - x1) * (y1 - y2)) / denominator * 0.5
    det1 = np.clip(a1 * b1 - c1**2, 0, None)
    det2 = np.clip(a2 * b2 - c2**2, 0, None)
    t3 = np.log(((a1 + a2) * (b1 + b2) - (c1 + c2) ** 2) / (4 * np.sqrt(det1 * det2) + _EPS) + _EPS) * 0.5
    distance = np.clip(t1 + t2 + t3, _EPS, 100.0)
    hellinger = np.sqrt(1.0 - np.exp(-distance) + _EPS)
    return (1.0 - hellinger).astype(np.float32)


def _fast_nms(boxes: npt.NDArray[np.float32], iou_threshold: float) -> npt.NDArray[np.intp]:
    """Indices (into `boxes`, sorted best first) kept: none of the earlier boxes overlaps them
    above `iou_threshold`."""
    n = len(boxes)
    dropped = np.zeros(n, bool)
    for start in range(0, n, BLOCK):
        rows = boxes[start : start + BLOCK]
        overlap = probiou(rows, boxes) > iou_threshold  # (block, n)
        # only a higher-scoring box (an earlier row) suppresses a later one
        earlier = np.arange(start, start + len(rows))[:, None] < np.arange(n)[None, :]
        dropped |= (overlap & earlier).any(axis=0)
    return np.flatnonzero(~dropped)


def rotated_nms_indices(
    xywhr: npt.NDArray[np.float32],
    scores: npt.NDArray[np.float32],
    iou_threshold: float,
    max_det: int | None = None,
    class_id: npt.NDArray[np.int32] | None = None,
) -> npt.NDArray[np.intp]:
    """Indices of the ``(n, 5)`` boxes kept by rotated NMS, highest score first, at most
    `max_det`; with `class_id` only boxes of one class suppress each other."""
    order = np.argsort(-scores, kind="stable")
    if class_id is None:
        groups = [order]
    else:
        by_class = order[np.argsort(class_id[order], kind="stable")]
        groups = np.split(by_class, np.flatnonzero(np.diff(class_id[by_class])) + 1)
    kept = [group[_fast_nms(xywhr[group], iou_threshold)] for group in groups if len(group)]
    keep = np.concatenate(kept) if kept else np.zeros(0, np.intp)
    return keep[np.argsort(-scores[keep], kind="stable")][:max_det].astype(np.intp)


def corners(xywhr: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The four corners ``(n, 4, 2)`` of each box, as Ultralytics' ``xywhr2xyxyxyxy`` orders them."""
    cx, cy, w, h, angle = (xywhr[:, i].astype(np.float64) for i in range(5))
    cos, sin = np.cos(angle), np.sin(angle)
    vx = np.stack([w / 2 * cos, w / 2 * sin], axis=1)
    vy = np.stack([-h / 2 * sin, h / 2 * cos], axis=1)
    centre = np.stack([cx, cy], axis=1)
    points = [centre + vx + vy, centre + vx - vy, centre - vx - vy, centre - vx + vy]
    return np.stack(points, axis=1).astype(np.float32)


def hull_xyxy(xywhr: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The axis-aligned box ``(n, 4)`` xyxy around each oriented box's corners."""
    points = corners(xywhr)
    return np.concatenate([points.min(axis=1), points.max(axis=1)], axis=1).astype(np.float32)
