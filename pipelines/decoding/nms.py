"""Non-maximum suppression as pure functions over arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections


def box_iou(box: npt.NDArray[np.float32], boxes: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """IoU of one ``(4,)`` xyxy box with each of ``(n, 4)`` xyxy boxes; returns ``(n,)``."""
    x1 = np.maximum(box[0], boxes[:, 0])
    y1 = np.maximum(box[1], boxes[:, 1])
    x2 = np.minimum(box[2], boxes[:, 2])
    y2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    union = area + areas - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-9), 0.0).astype(np.float32)


def _greedy(
    columns: tuple[npt.NDArray[Any], ...],
    areas: npt.NDArray[Any],
    order: npt.NDArray[Any],
    iou_threshold: float,
    limit: int | None = None,
) -> list[int]:
    """Greedy suppression over `order` (indices, best first) of boxes given as x1, y1, x2, y2
    columns; stops once `limit` boxes are kept (they are the best `limit` survivors)."""
    x1, y1, x2, y2 = columns
    keep: list[int] = []
    while order.size and (limit is None or len(keep) < limit):
        best = int(order[0])
        keep.append(best)
        rest = order[1:]
        w = np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest])
        h = np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest])
        inter = np.maximum(w, 0) * np.maximum(h, 0)
        # iou <= t  <=>  inter <= t * union, without a division
        order = rest[inter <= iou_threshold * (areas[best] + areas[rest] - inter)]
    return keep


def nms_indices(
    xyxy: npt.NDArray[np.float32],
    scores: npt.NDArray[np.float32],
    iou_threshold: float,
    max_det: int | None = None,
    class_id: npt.NDArray[np.int32] | None = None,
) -> npt.NDArray[np.intp]:
    """Greedy NMS: indices of the ``(n, 4)`` xyxy boxes kept, highest score first.

    A box is dropped when its IoU with a kept, higher-scoring box exceeds `iou_threshold`.
    With `class_id`, only boxes of the same class suppress each other. At most `max_det`
    indices are returned.
    """
    columns = tuple(np.ascontiguousarray(xyxy[:, i]) for i in range(4))
    areas = (columns[2] - columns[0]) * (columns[3] - columns[1])
    order = np.argsort(-scores, kind="stable")
    if class_id is None:
        groups = [order]
    else:
        # A stable sort by class keeps each class's boxes in score order.
        by_class = order[np.argsort(class_id[order], kind="stable")]
        groups = np.split(by_class, np.flatnonzero(np.diff(class_id[by_class])) + 1)
    # A group's survivors beyond its best max_det can never be among the best max_det overall.
    kept = [i for group in groups for i in _greedy(columns, areas, group, iou_threshold, max_det)]
    keep = np.asarray(kept, np.intp)
    return keep[np.argsort(-scores[keep], kind="stable")][:max_det]


def class_aware_nms(detections: Detections, iou_threshold: float, max_det: int) -> Detections:
    """NMS within each class (boxes of different classes never suppress each other).

    Returns at most `max_det` detections, highest confidence first.
    """
    if len(detections) == 0:
        return detections
    keep = nms_indices(detections.xyxy, detections.confidence, iou_threshold, max_det, detections.class_id)
    return detections[keep]
