"""Non-maximum suppression as pure functions over arrays."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from pipelines.detections import Detections


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


def nms_indices(
    xyxy: npt.NDArray[np.float32],
    scores: npt.NDArray[np.float32],
    iou_threshold: float,
    max_det: int | None = None,
) -> npt.NDArray[np.intp]:
    """Greedy NMS: indices of the boxes kept, highest score first.

    A box is dropped when its IoU with an already kept, higher-scoring box exceeds
    `iou_threshold`. Stops after `max_det` boxes when given.
    """
    order = np.argsort(-scores, kind="stable")
    keep: list[int] = []
    limit = len(order) if max_det is None else max_det
    while order.size and len(keep) < limit:
        best = int(order[0])
        keep.append(best)
        rest = order[1:]
        if not rest.size:
            break
        order = rest[box_iou(xyxy[best], xyxy[rest]) <= iou_threshold]
    return np.asarray(keep, dtype=np.intp)


def class_aware_nms(detections: Detections, iou_threshold: float, max_det: int) -> Detections:
    """NMS within each class (boxes of different classes never suppress each other).

    Returns at most `max_det` detections, highest confidence first.
    """
    if len(detections) == 0:
        return detections
    boxes = detections.xyxy
    # Shift each class into its own region of the plane, so one NMS pass never mixes classes.
    span = float(boxes.max()) - min(float(boxes.min()), 0.0) + 1.0
    shifted = boxes + (detections.class_id.astype(np.float32) * span)[:, None]
    return detections[nms_indices(shifted, detections.confidence, iou_threshold, max_det)]
