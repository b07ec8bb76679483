"""Query decoders: outputs that already are final detections, one row per query; no NMS after.

- ``end2end``: one output ``(1, K, 6)``, rows ``x1, y1, x2, y2, score, class``: Ultralytics
  ``export(nms=True)`` (NMS inside the graph, rows zero-padded to K) and the end-to-end heads of
  YOLOv10 / YOLO26 (the top K rows, no NMS needed). ``score`` and ``class`` may come in either
  order (the class column holds whole numbers); ``(1, K, 7)`` carries a batch index first.
  Boxes are in input pixels, or normalised 0..1 (TFLite exports): detected from the values.
- ``rtdetr``: one output per query of normalised ``cx, cy, w, h`` then either ``score, class``
  (``(1, 300, 6)``: Ultralytics 8.4 RT-DETR exports, whose head picks the top 300 (query, class)
  pairs) or ``nc`` class scores already in 0..1 (``(1, 300, 4+nc)``: earlier exports).
- ``detr``: two outputs, boxes ``(1, Q, 4)`` as normalised ``cx, cy, w, h`` and class values
  ``(1, Q, C)`` (RF-DETR, D-FINE and DETR exports), in either order. Scores are
  ``sigmoid(values)``, or ``softmax`` over ``C`` whose last column is "no object" (the original
  DETR), or the values themselves when they are probabilities already: `detr_scores` decides
  once per model, from its outputs on a blank frame.

Every decoder returns detections in input-tensor pixels above ``conf``; the caller keeps the
best ``max_det``. Pure functions, safe from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from pipelines.decoding.decoders import DecoderError, cxcywh_to_xyxy, scale_if_normalised, single_output
from pipelines.decoding.detections import Detections

#: how scores come out of a DETR-style model's class values
DetrScores = Literal["sigmoid", "softmax", "probabilities"]
#: query models have at most this many rows; grid models have thousands (8400 at 640x640)
MAX_QUERIES = 1000
#: a value this close to a whole number counts as one (class ids through float arithmetic)
_WHOLE = 1e-3
#: a DETR model whose last class column wins in this share of blank-frame queries has "no object"
_NO_OBJECT_SHARE = 0.9


def _whole(values: npt.NDArray[Any]) -> bool:
    """All values are whole numbers (true for none)."""
    return bool(np.all(np.abs(values - np.rint(values)) <= _WHOLE))


def _end2end_rows(outputs: Sequence[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """The ``(K, 6)`` rows of an end-to-end output, without a leading batch-index column."""
    out = single_output(outputs, "end2end")
    if out.shape[1] == 7:
        out = out[:, 1:]
    if out.shape[1] != 6:
        raise DecoderError(
            "end2end expects rows of 6 values (x1, y1, x2, y2, score, class), or 7 with a batch index "
            f"first, got {tuple(outputs[0].shape)}"
        )
    return out


def _score_and_class(rows: npt.NDArray[Any]) -> tuple[int, int]:
    """Columns of the score and the class id: the class column holds whole numbers; Ultralytics'
    order (score, class) when both or neither do (rows of zero padding)."""
    if _whole(rows[:, 4]) and not _whole(rows[:, 5]):
        return 5, 4
    return 4, 5


def end2end_evidence(outputs: Sequence[npt.NDArray[Any]]) -> str | None:
    """Why these outputs (of one frame) look like end-to-end rows, or None when they do not.

    Files from exporters that write no metadata are recognised by content: one output
    ``(1, K, 6)`` or ``(1, K, 7)`` of at most `MAX_QUERIES` rows (a whole-number batch index
    first in the 7-column form) whose class column holds whole numbers and whose boxes are
    ordered (``x1 <= x2``, ``y1 <= y2``).
    """
    if len(outputs) != 1 or outputs[0].ndim != 3 or outputs[0].shape[0] != 1:
        return None
    shape = tuple(outputs[0].shape)
    if shape[-1] not in (6, 7) or not 0 < shape[-2] <= MAX_QUERIES:
        return None
    rows = outputs[0][0]
    if shape[-1] == 7:
        if not _whole(rows[:, 0]) or float(rows[:, 0].min()) < 0:
            return None
        rows = rows[:, 1:]
    if not (_whole(rows[:, 4]) or _whole(rows[:, 5])):
        return None
    slack = _WHOLE * max(1.0, float(np.abs(rows[:, :4]).max()))
    if np.any(rows[:, 2] < rows[:, 0] - slack) or np.any(rows[:, 3] < rows[:, 1] - slack):
        return None
    return f"output {shape}: {shape[-2]} rows with a whole-number class column and ordered x1 <= x2, y1 <= y2 boxes"


def decode_end2end(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """``(1, K, 6)`` or ``(1, K, 7)`` final rows -> detections above `conf` (input pixels)."""
    rows = _end2end_rows(outputs)
    score, cls = _score_and_class(rows)
    keep = rows[:, score] > conf
    boxes = scale_if_normalised(rows[keep, :4].astype(np.float32), rows[:, :4], input_hw)
    return Detections(
        boxes.astype(np.float32).reshape(-1, 4),
        rows[keep, score].astype(np.float32),
        np.rint(rows[keep, cls]).astype(np.int32),
    )


def _above(
    cxcywh: npt.NDArray[Any],
    scores: npt.NDArray[Any],
    class_id: npt.NDArray[Any],
    input_hw: tuple[int, int],
    conf: float,
) -> Detections:
    """Queries scoring above `conf`: ``(Q, 4)`` centre boxes (normalised, or input pixels: detected
    from the values), ``(Q,)`` scores and class ids -> detections in input pixels."""
    keep = scores > conf
    rows = cxcywh[keep]
    boxes = cxcywh_to_xyxy(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])
    boxes = scale_if_normalised(boxes, cxcywh[:, :2], input_hw)
    return Detections(boxes.astype(np.float32), scores[keep].astype(np.float32), class_id[keep].astype(np.int32))


def _best_class(scores: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Per row of ``(Q, C)`` scores: the best class and its score."""
    class_id = scores.argmax(axis=1)
    return class_id, scores[np.arange(len(scores)), class_id]


def rtdetr_evidence(outputs: Sequence[npt.NDArray[Any]]) -> str | None:
    """Why these outputs (of one frame) look like an Ultralytics 8.4 RT-DETR export, or None:
    one output ``(1, Q, 6)`` of at most `MAX_QUERIES` rows whose box and score columns lie in
    0..1 and whose last column holds whole numbers (the class), its boxes not ordered as corners
    (``cx, cy, w, h``: not end-to-end rows)."""
    if len(outputs) != 1 or outputs[0].ndim != 3 or outputs[0].shape[0] != 1 or outputs[0].shape[2] != 6:
        return None
    rows = outputs[0][0]
    if not 0 < len(rows) <= MAX_QUERIES or not _whole(rows[:, 5]) or end2end_evidence(outputs) is not None:
        return None
    if float(rows[:, :5].min()) < -_WHOLE or float(rows[:, :5].max()) > 1 + _WHOLE:
        return None
    return f"output {tuple(outputs[0].shape)}: normalised cx, cy, w, h, a score and a whole-number class per query"


def _rtdetr_scores(out: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Class ids and scores of RT-DETR rows: ``score, class`` columns (6 values, the last whole
    numbers), else per-class scores."""
    if out.shape[1] == 6 and _whole(out[:, 5]):
        return np.rint(out[:, 5]), out[:, 4]
    return _best_class(out[:, 4:])


def decode_rtdetr(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """``(1, Q, 6)`` or ``(1, Q, 4+nc)`` RT-DETR queries -> detections above `conf` (input pixels)."""
    out = single_output(outputs, "rtdetr")
    if out.shape[1] < 5:
        raise DecoderError(f"rtdetr expects rows of 4 box values and class scores, got {tuple(outputs[0].shape)}")
    class_id, scores = _rtdetr_scores(out)
    return _above(out[:, :4], scores, class_id, input_hw, conf)


def _detr_parts(outputs: Sequence[npt.NDArray[Any]]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Boxes ``(Q, 4)`` and class values ``(Q, C)`` of a two-output DETR-style model, in either
    order; when both have 4 columns, the boxes are the one whose values all lie in 0..1."""
    shapes = [tuple(o.shape) for o in outputs]
    expected = f"detr expects two outputs, boxes (1, Q, 4) and class values (1, Q, C), got {shapes}"
    if len(outputs) != 2 or any(o.ndim != 3 or o.shape[0] != 1 for o in outputs):
        raise DecoderError(expected)
    a, b = outputs[0][0], outputs[1][0]
    if a.shape[0] != b.shape[0] or 4 not in (a.shape[1], b.shape[1]):
        raise DecoderError(expected)
    if a.shape[1] == 4 and b.shape[1] == 4:
        a_unit = float(a.min(initial=0.0)) >= 0.0 and float(a.max(initial=0.0)) <= 1.0
        return (a, b) if a_unit else (b, a)
    return (a, b) if a.shape[1] == 4 else (b, a)


def detr_scores(outputs: Sequence[npt.NDArray[Any]], num_classes: int | None = None) -> tuple[DetrScores, str]:
    """How a DETR-style model's class values become scores, decided from its outputs on a blank
    frame (and the class count its metadata names). Returns (mode, reason)."""
    _, values = _detr_parts(outputs)
    columns = values.shape[1]
    if float(values.min(initial=0.0)) >= 0.0 and float(values.max(initial=0.0)) <= 1.0:
        return "probabilities", "class values lie in 0..1 already"
    if num_classes is not None and columns == num_classes + 1:
        return "softmax", f"{columns} class columns for {num_classes} named classes: the last is 'no object'"
    if num_classes is None and columns >= 3:
        share = float(np.mean(values.argmax(axis=1) == columns - 1)) if len(values) else 0.0
        if share >= _NO_OBJECT_SHARE:
            return (
                "softmax",
                f"the last of {columns} class columns wins in {share:.0%} of queries on a blank frame: 'no object'",
            )
    return "sigmoid", "independent class logits"


def decode_detr(
    outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float, scores: DetrScores = "sigmoid"
) -> Detections:
    """Boxes ``(1, Q, 4)`` + class values ``(1, Q, C)`` -> detections above `conf` (input pixels)."""
    boxes, values = _detr_parts(outputs)
    values = values.astype(np.float32)
    if scores == "softmax":
        shifted = np.exp(values - values.max(axis=1, keepdims=True))
        probabilities = (shifted / shifted.sum(axis=1, keepdims=True))[:, :-1]
    elif scores == "sigmoid":
        probabilities = 0.5 * (1.0 + np.tanh(0.5 * values))  # the logistic function, without overflow
    else:
        probabilities = values
    class_id, best = _best_class(probabilities)
    return _above(boxes, best, class_id, input_hw, conf)
