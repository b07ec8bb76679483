"""Decoders of Ultralytics task heads (v8 / 11 / 26): instance segmentation, pose and oriented
boxes, in their grid form (NMS after) and their end-to-end form (final rows, no NMS).

Layouts (Ultralytics 8.4's heads and exporter; ``nc`` classes, ``nm`` = 32 mask coefficients,
``K`` keypoints of ``d`` = 2 or 3 values, metadata ``kpt_shape = [K, d]``):

- ``yolov8-seg``: ``(1, 4+nc+nm, N)`` ``cx, cy, w, h``, class scores, mask coefficients; and the
  prototypes ``(1, nm, H/4, W/4)`` (ONNX, TensorRT) or ``(1, H/4, W/4, nm)`` (channel-last TFLite).
- ``yolov8-pose``: ``(1, 4+nc+K*d, N)``: box, class scores, then per keypoint ``x, y[, score]``.
- ``yolov8-obb``: ``(1, 4+nc+1, N)``: ``cx, cy, w, h`` of the rotated box, class scores, then
  the angle in radians (in [-pi/4, 3pi/4)); rotated NMS after (`pipelines.decoding.rotated`).
- ``end2end-seg``: ``(1, 300, 6+nm)`` rows ``x1, y1, x2, y2, score, class, coefficients`` and
  the prototypes; ``end2end-pose``: ``(1, 300, 6+K*d)``; ``end2end-obb``: ``(1, 300, 7)`` rows
  ``cx, cy, w, h, score, class, angle``.

Outputs are matched by shape, never by order (the prototypes are the 4-D output), so TensorRT
engines, whose outputs may come in another order, decode alike. Coordinates are input pixels
(ONNX) or normalised 0..1 (TFLite), told apart from the values as the box decoders do; keypoints
follow the boxes. A grid output may also come transposed, ``(1, N, C)``. Every decoder returns
`Detections` in input-tensor pixels with `masks`, `keypoints` or `xywhr` set; `xyxy` is always
the axis-aligned box (for obb: around the corners). Pure functions; safe from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from pipelines.decoding.decoders import (
    DecoderError,
    cxcywh_to_xyxy,
    scale_if_normalised,
    top_candidates,
)
from pipelines.decoding.detections import Detections
from pipelines.decoding.masks import Masks
from pipelines.decoding.rotated import hull_xyxy

#: Ultralytics' COCO pose models: 17 keypoints of x, y, score
DEFAULT_KPT_SHAPE = (17, 3)
_NORMALISED_LIMIT = 2.0


def _split_outputs(
    outputs: Sequence[npt.NDArray[Any]], decoder: str, prototypes: bool
) -> tuple[npt.NDArray[Any], npt.NDArray[Any] | None]:
    """The one 3-D prediction output (batch dropped) and, with `prototypes`, the one 4-D output."""
    shapes = [tuple(o.shape) for o in outputs]
    preds = [o for o in outputs if o.ndim == 3]
    protos = [o for o in outputs if o.ndim == 4]
    want = 2 if prototypes else 1
    if len(outputs) != want or len(preds) != 1 or len(protos) != want - 1 or preds[0].shape[0] != 1:
        expected = (
            "a prediction output (1, A, B) and prototypes (1, nm, h, w)" if prototypes else "one output (1, A, B)"
        )
        raise DecoderError(f"{decoder} expects {expected}, the model has {shapes}")
    return preds[0][0], protos[0] if protos else None


def _grid(out: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``(C, N)`` channels first (a transposed ``(N, C)`` output is turned)."""
    return out.T if out.shape[0] > out.shape[1] else out


def prototype_planes(protos: npt.NDArray[Any], input_hw: tuple[int, int]) -> npt.NDArray[np.float32]:
    """``(nm, mh, mw)`` prototypes from ``(1, nm, mh, mw)`` or channel-last ``(1, mh, mw, nm)``:
    the channel axis is the one whose other two sizes divide the input by one same factor."""
    _, a, b, c = protos.shape
    h, w = input_hw

    def fits(mh: int, mw: int) -> bool:
        return mh > 0 and mw > 0 and h * mw == w * mh and h >= mh

    if fits(b, c):
        planes = protos[0]
    elif fits(a, b):
        planes = protos[0].transpose(2, 0, 1)
    else:
        raise DecoderError(
            f"segmentation prototypes {tuple(protos.shape)} fit neither (1, nm, h, w) nor (1, h, w, nm) "
            f"for a {w}x{h} input"
        )
    return np.ascontiguousarray(planes, np.float32)


def _is_normalised(values: npt.NDArray[Any]) -> bool:
    return bool(values.size) and float(np.abs(values).max()) <= _NORMALISED_LIMIT


def _scale_keypoints(kpts: npt.NDArray[Any], normalised: bool, input_hw: tuple[int, int]) -> npt.NDArray[np.float32]:
    kpts = kpts.astype(np.float32, copy=True)
    if normalised:
        kpts[..., 0] *= input_hw[1]
        kpts[..., 1] *= input_hw[0]
    return kpts


def _grid_candidates(pred: npt.NDArray[Any], nc: int, conf: float) -> tuple[npt.NDArray[Any], ...]:
    """Indices above `conf`, their scores and classes, for ``(C, N)`` with `nc` class rows at 4."""
    class_scores = pred[4 : 4 + nc]
    scores = class_scores.max(axis=0)
    idx = top_candidates(np.flatnonzero(scores > conf), scores)
    return idx, scores[idx].astype(np.float32), class_scores[:, idx].argmax(axis=0).astype(np.int32)


def _classes_left(total: int, extra: int, decoder: str, what: str, shape: tuple[int, ...]) -> int:
    nc = total - 4 - extra
    if nc < 1:
        raise DecoderError(
            f"{decoder}: output {shape} has {total} values per candidate, too few for 4 box values, {what}"
        )
    return nc


def decode_yolov8_seg(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """``(1, 4+nc+nm, N)`` + prototypes -> candidates above `conf` with their masks (input pixels)."""
    raw, protos = _split_outputs(outputs, "yolov8-seg", prototypes=True)
    assert protos is not None
    planes = prototype_planes(protos, input_hw)
    pred = _grid(raw)
    nm = planes.shape[0]
    nc = _classes_left(pred.shape[0], nm, "yolov8-seg", f"classes and {nm} mask coefficients", tuple(raw.shape))
    idx, scores, class_id = _grid_candidates(pred, nc, conf)
    boxes = cxcywh_to_xyxy(pred[0, idx], pred[1, idx], pred[2, idx], pred[3, idx])
    boxes = scale_if_normalised(boxes, pred[:2], input_hw)
    coefficients = np.ascontiguousarray(pred[4 + nc :, idx].T, np.float32)
    return Detections(boxes, scores, class_id, masks=Masks(coefficients, planes, boxes, input_hw))


def decode_yolov8_pose(
    outputs: Sequence[npt.NDArray[Any]],
    input_hw: tuple[int, int],
    conf: float,
    kpt_shape: tuple[int, int] = DEFAULT_KPT_SHAPE,
) -> Detections:
    """``(1, 4+nc+K*d, N)`` -> candidates above `conf` with ``(n, K, d)`` keypoints (input pixels)."""
    raw, _ = _split_outputs(outputs, "yolov8-pose", prototypes=False)
    pred = _grid(raw)
    k, d = kpt_shape
    nc = _classes_left(pred.shape[0], k * d, "yolov8-pose", f"classes and {k}x{d} keypoint values", tuple(raw.shape))
    idx, scores, class_id = _grid_candidates(pred, nc, conf)
    boxes = cxcywh_to_xyxy(pred[0, idx], pred[1, idx], pred[2, idx], pred[3, idx])
    normalised = _is_normalised(pred[:2])
    boxes = scale_if_normalised(boxes, pred[:2], input_hw)
    kpts = _scale_keypoints(pred[4 + nc :, idx].T.reshape(-1, k, d), normalised, input_hw)
    return Detections(boxes, scores, class_id, keypoints=kpts)


def _obb_rows(
    xywh: npt.NDArray[Any], angle: npt.NDArray[Any], normalised: bool, input_hw: tuple[int, int]
) -> npt.NDArray[np.float32]:
    """``(n, 5)`` xywhr in input pixels from ``(n, 4)`` xywh (`normalised` or pixels) and angles."""
    xywhr = np.concatenate([xywh, angle[:, None]], axis=1).astype(np.float32)
    if normalised:
        h, w = input_hw
        xywhr[:, :4] *= np.array([w, h, w, h], np.float32)
    return xywhr


def decode_yolov8_obb(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """``(1, 4+nc+1, N)`` -> candidates above `conf` with their oriented boxes (input pixels)."""
    raw, _ = _split_outputs(outputs, "yolov8-obb", prototypes=False)
    pred = _grid(raw)
    nc = _classes_left(pred.shape[0], 1, "yolov8-obb", "classes and an angle", tuple(raw.shape))
    idx, scores, class_id = _grid_candidates(pred, nc, conf)
    xywhr = _obb_rows(pred[:4, idx].T, pred[4 + nc, idx], _is_normalised(pred[:2]), input_hw)
    return Detections(hull_xyxy(xywhr), scores, class_id, xywhr=xywhr)


def _end2end_rows(outputs: Sequence[npt.NDArray[Any]], decoder: str, values: int, prototypes: bool) -> tuple[Any, Any]:
    rows, protos = _split_outputs(outputs, decoder, prototypes)
    if rows.shape[1] != values:
        raise DecoderError(f"{decoder} expects rows of {values} values, got {tuple(outputs[0].shape)}")
    return rows, protos


def _end2end_common(rows: npt.NDArray[Any], conf: float) -> tuple[npt.NDArray[Any], ...]:
    keep = np.flatnonzero(rows[:, 4] > conf)
    return keep, rows[keep, 4].astype(np.float32), np.rint(rows[keep, 5]).astype(np.int32)


def _end2end_boxes(rows: npt.NDArray[Any], keep: npt.NDArray[Any], input_hw: tuple[int, int]) -> tuple[Any, bool]:
    """xyxy of the kept rows in input pixels; whether the model's rows are normalised."""
    boxes = rows[keep, :4].astype(np.float32)
    normalised = _is_normalised(rows[:, :4])
    if normalised:
        h, w = input_hw
        boxes = boxes * np.array([w, h, w, h], np.float32)
    return boxes, normalised


def decode_end2end_seg(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """``(1, K, 6+nm)`` rows + prototypes -> detections above `conf` with their masks."""
    protos = [o for o in outputs if o.ndim == 4]
    if len(protos) != 1:
        raise DecoderError(
            f"end2end-seg expects rows and prototypes, the model has {[tuple(o.shape) for o in outputs]}"
        )
    planes = prototype_planes(protos[0], input_hw)
    rows, _ = _end2end_rows(outputs, "end2end-seg", 6 + planes.shape[0], prototypes=True)
    keep, scores, class_id = _end2end_common(rows, conf)
    boxes, _ = _end2end_boxes(rows, keep, input_hw)
    coefficients = np.ascontiguousarray(rows[keep, 6:], np.float32)
    return Detections(boxes, scores, class_id, masks=Masks(coefficients, planes, boxes, input_hw))


def decode_end2end_pose(
    outputs: Sequence[npt.NDArray[Any]],
    input_hw: tuple[int, int],
    conf: float,
    kpt_shape: tuple[int, int] = DEFAULT_KPT_SHAPE,
) -> Detections:
    """``(1, K, 6+K*d)`` rows -> detections above `conf` with their keypoints."""
    k, d = kpt_shape
    rows, _ = _end2end_rows(outputs, "end2end-pose", 6 + k * d, prototypes=False)
    keep, scores, class_id = _end2end_common(rows, conf)
    boxes, normalised = _end2end_boxes(rows, keep, input_hw)
    kpts = _scale_keypoints(rows[keep, 6:].reshape(-1, k, d), normalised, input_hw)
    return Detections(boxes, scores, class_id, keypoints=kpts)


def decode_end2end_obb(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """``(1, K, 7)`` rows ``cx, cy, w, h, score, class, angle`` -> detections above `conf`."""
    rows, _ = _end2end_rows(outputs, "end2end-obb", 7, prototypes=False)
    keep, scores, class_id = _end2end_common(rows, conf)
    xywhr = _obb_rows(rows[keep, :4], rows[keep, 6], _is_normalised(rows[:, :2]), input_hw)
    return Detections(hull_xyxy(xywhr), scores, class_id, xywhr=xywhr)
