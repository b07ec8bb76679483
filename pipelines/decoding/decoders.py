"""Decoders: raw detector outputs -> candidate `Detections` in input-tensor pixels.

Each decoder takes the model's outputs as float32 arrays (already dequantized), the input
tensor's (height, width) in pixels and a confidence threshold. The grid decoders here return
candidates for NMS; the query decoders (``end2end``, ``rtdetr``, ``detr``) are in
`pipelines.decoding.query_decoders` and return final detections; the task decoders (``-seg``,
``-pose``, ``-obb``) are in `pipelines.decoding.task_decoders`. The table of all of them and the
automatic choice are in `pipelines.decoding.decoder_choice`. Grid layouts:

- ``yolov8`` (YOLOv8 / YOLO11 / the project's demo model): one output ``(1, 4+nc, N)`` (or its
  transpose ``(1, N, 4+nc)``): ``cx, cy, w, h`` then ``nc`` class scores, no objectness. Boxes
  are in input pixels (ONNX exports) or normalised 0..1 (TFLite exports): detected from values.
- ``yolov5``: ``(1, N, 5+nc)``: ``cx, cy, w, h, objectness, nc class scores``; score = obj * cls.
- ``yolox``: ``(1, N, 5+nc)`` with N = cells of strides 8/16/32 and boxes *not* decoded:
  ``cx = (o0 + gx) * s, w = exp(o2) * s``; an output already decoded is recognised. Chosen
  automatically only for models without class names in their metadata (YOLOX exports have
  none); a named model of that shape is taken as YOLOv5-style.
- ``ssd``: the four outputs of TFLite's detection post-process: boxes ``(1, K, 4)`` as
  normalised ``ymin, xmin, ymax, xmax``, classes ``(1, K)``, scores ``(1, K)``, count ``(1,)``,
  in any order.

Decoder names are defined once here (`DecoderName`); the manifest's ``decoder`` field and the
CLI's ``--decoder`` choices derive from it. Pure functions; safe from any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, get_args

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections

DecoderName = Literal[
    "yolov8",
    "yolov5",
    "yolox",
    "ssd",
    "end2end",
    "rtdetr",
    "detr",
    "yolov8-seg",
    "yolov8-pose",
    "yolov8-obb",
    "end2end-seg",
    "end2end-pose",
    "end2end-obb",
]
DECODER_NAMES: tuple[DecoderName, ...] = get_args(DecoderName)
#: what a user may ask for: a decoder, or "auto" (chosen from the output shapes and metadata)
DecoderChoice = Literal["auto", DecoderName]
DECODER_CHOICES: tuple[str, ...] = get_args(DecoderChoice)


def artifact_decoder(decoder: str, final_detections: bool) -> str:
    """The decoder for one artifact of a bundle whose manifest names `decoder`: that one, except
    ``end2end`` where the artifact's runtime gives final detections (`final_detections`: its
    metadata says ``end2end``, a HEF with NMS on the chip) while the manifest's reads raw outputs
    (the ONNX model it was compiled from)."""
    return "end2end" if final_detections and decoder != "end2end" else decoder


YOLOX_STRIDES = (8, 16, 32)
#: boxes whose centre coordinates never exceed this are taken as normalised 0..1
_NORMALISED_LIMIT = 2.0
#: more candidates than this after the confidence threshold are cut to the best ones
MAX_CANDIDATES = 30000
#: a decoder: (outputs as float32 arrays, input (height, width) in pixels, conf) -> detections
Decode = Callable[[Sequence[npt.NDArray[Any]], tuple[int, int], float], Detections]


class DecoderError(ValueError):
    """The model's outputs do not fit the chosen decoder, or no decoder fits them."""


@dataclass(frozen=True)
class InputConvention:
    """How a model family expects its input (see `pipelines.decoding.preprocess.PreprocessConfig`)."""

    resize: Literal["letterbox", "letterbox-topleft", "stretch"]
    color: Literal["RGB", "BGR"]
    mean: float
    std: float


CONVENTIONS: dict[DecoderName, InputConvention] = {
    "yolov8": InputConvention("letterbox", "RGB", 0.0, 255.0),
    "yolov5": InputConvention("letterbox", "RGB", 0.0, 255.0),
    "yolox": InputConvention("letterbox-topleft", "BGR", 0.0, 1.0),
    "ssd": InputConvention("stretch", "RGB", 127.5, 127.5),
    "end2end": InputConvention("letterbox", "RGB", 0.0, 255.0),
    # Ultralytics' RT-DETR predictor stretches to the square input (LetterBox scale_fill)
    "rtdetr": InputConvention("stretch", "RGB", 0.0, 255.0),
    # DETR / RF-DETR: ImageNet normalisation, approximated by one mean and std for all channels
    "detr": InputConvention("stretch", "RGB", 114.5, 57.6),
    # Ultralytics' task heads (pipelines.decoding.task_decoders): its detection preprocessing
    **{
        name: InputConvention("letterbox", "RGB", 0.0, 255.0)
        for name in ("yolov8-seg", "yolov8-pose", "yolov8-obb", "end2end-seg", "end2end-pose", "end2end-obb")
    },
}


def cxcywh_to_xyxy(
    cx: npt.NDArray[Any], cy: npt.NDArray[Any], w: npt.NDArray[Any], h: npt.NDArray[Any]
) -> npt.NDArray[Any]:
    half_w, half_h = w / 2, h / 2
    return np.stack([cx - half_w, cy - half_h, cx + half_w, cy + half_h], axis=1).astype(np.float32)


def single_output(outputs: Sequence[npt.NDArray[Any]], decoder: str) -> npt.NDArray[Any]:
    if len(outputs) != 1:
        shapes = [tuple(o.shape) for o in outputs]
        raise DecoderError(f"{decoder} expects one output, the model has {len(outputs)}: {shapes}")
    out = outputs[0]
    if out.ndim == 2:
        out = out[None]
    if out.ndim != 3 or out.shape[0] != 1:
        raise DecoderError(f"{decoder} expects an output of shape (1, A, B), got {tuple(outputs[0].shape)}")
    first: npt.NDArray[Any] = out[0]
    return first


def top_candidates(idx: npt.NDArray[Any], scores: npt.NDArray[Any]) -> npt.NDArray[Any]:
    if idx.size > MAX_CANDIDATES:
        idx = idx[np.argsort(-scores[idx], kind="stable")[:MAX_CANDIDATES]]
    return idx


def scale_if_normalised(
    boxes: npt.NDArray[Any], all_centres: npt.NDArray[Any], input_hw: tuple[int, int]
) -> npt.NDArray[Any]:
    """Scale xyxy boxes by the input size when the model's centre coordinates are normalised."""
    if all_centres.size and float(np.abs(all_centres).max()) <= _NORMALISED_LIMIT:
        h, w = input_hw
        boxes = boxes * np.array([w, h, w, h], dtype=np.float32)
    return boxes


def decode_yolov8(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """``(1, 4+nc, N)`` or ``(1, N, 4+nc)`` -> candidates above `conf` (input pixels)."""
    out = single_output(outputs, "yolov8")
    if out.shape[0] > out.shape[1]:
        out = out.T  # (N, 4+nc) -> (4+nc, N)
    if out.shape[0] < 5:
        raise DecoderError(f"yolov8 expects 4 box rows and at least one class row, got {out.shape}")
    class_scores = out[4:]
    scores = class_scores.max(axis=0)
    idx = top_candidates(np.flatnonzero(scores > conf), scores)
    class_id = class_scores[:, idx].argmax(axis=0)
    boxes = cxcywh_to_xyxy(out[0, idx], out[1, idx], out[2, idx], out[3, idx])
    boxes = scale_if_normalised(boxes, out[:2], input_hw)
    return Detections(boxes, scores[idx].astype(np.float32), class_id.astype(np.int32))


def decode_yolov5(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """``(1, N, 5+nc)`` with objectness -> candidates above `conf` (input pixels)."""
    out = single_output(outputs, "yolov5")
    if out.shape[1] < 6:
        raise DecoderError(f"yolov5 expects rows of 5 + classes values, got {out.shape}")
    rows = out[out[:, 4] > conf]  # objectness bounds the final score
    class_scores = rows[:, 5:] * rows[:, 4:5]
    class_id = class_scores.argmax(axis=1)
    scores = class_scores[np.arange(len(rows)), class_id]
    idx = top_candidates(np.flatnonzero(scores > conf), scores)
    rows = rows[idx]
    boxes = cxcywh_to_xyxy(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])
    boxes = scale_if_normalised(boxes, out[:, :2], input_hw)
    return Detections(boxes, scores[idx].astype(np.float32), class_id[idx].astype(np.int32))


def yolox_cells(input_hw: tuple[int, int], strides: Sequence[int] = YOLOX_STRIDES) -> int:
    """Number of grid cells of a YOLOX / YOLOv8 head for this input size."""
    h, w = input_hw
    return sum((h // s) * (w // s) for s in strides)


@lru_cache(maxsize=8)
def _yolox_grid(input_hw: tuple[int, int]) -> tuple[npt.NDArray[Any], npt.NDArray[Any]]:
    """Cell offsets ``(N, 2)`` (gx, gy) and strides ``(N, 1)``, row-major, x fastest."""
    h, w = input_hw
    grids, strides = [], []
    for s in YOLOX_STRIDES:
        gy, gx = np.mgrid[0 : h // s, 0 : w // s]
        grids.append(np.stack([gx.ravel(), gy.ravel()], axis=1))
        strides.append(np.full((gx.size, 1), s))
    return np.concatenate(grids).astype(np.float32), np.concatenate(strides).astype(np.float32)


def decode_yolox(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """``(1, N, 5+nc)`` YOLOX head output -> candidates above `conf` (input pixels)."""
    out = single_output(outputs, "yolox")
    if out.shape[1] < 6:
        raise DecoderError(f"yolox expects rows of 5 + classes values, got {out.shape}")
    # Undecoded offsets stay within a few cells; decoded centres are pixel positions.
    decoded = float(np.abs(out[:, :2]).max(initial=0.0)) > 4.0
    keep = np.flatnonzero(out[:, 4] > conf)
    rows = out[keep]
    class_scores = rows[:, 5:] * rows[:, 4:5]
    class_id = class_scores.argmax(axis=1)
    scores = class_scores[np.arange(len(rows)), class_id]
    sel = top_candidates(np.flatnonzero(scores > conf), scores)
    rows, keep = rows[sel], keep[sel]
    if decoded:
        centres, sizes = rows[:, :2], rows[:, 2:4]
    else:
        grid, stride = _yolox_grid(input_hw)
        if grid.shape[0] != out.shape[0]:
            raise DecoderError(
                f"yolox output has {out.shape[0]} rows but a {input_hw[1]}x{input_hw[0]} input "
                f"has {grid.shape[0]} cells at strides {YOLOX_STRIDES}"
            )
        centres = (rows[:, :2] + grid[keep]) * stride[keep]
        sizes = np.exp(rows[:, 2:4]) * stride[keep]
    boxes = cxcywh_to_xyxy(centres[:, 0], centres[:, 1], sizes[:, 0], sizes[:, 1])
    return Detections(boxes, scores[sel].astype(np.float32), class_id[sel].astype(np.int32))


def _ssd_roles(outputs: Sequence[npt.NDArray[Any]]) -> tuple[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any], int]:
    """Find boxes, classes, scores and count among the four post-process outputs."""
    shapes = [tuple(o.shape) for o in outputs]
    if len(outputs) != 4:
        raise DecoderError(f"ssd expects 4 outputs (boxes, classes, scores, count), got {shapes}")
    boxes = [o for o in outputs if o.ndim == 3 and o.shape[-1] == 4]
    pairs = [o for o in outputs if o.ndim == 2]
    counts = [o for o in outputs if o.ndim == 1 and o.size == 1]
    if len(boxes) != 1 or len(pairs) != 2 or len(counts) != 1:
        raise DecoderError(f"ssd expects outputs shaped (1, K, 4), (1, K), (1, K), (1,), got {shapes}")
    a, b = pairs[0][0], pairs[1][0]

    def looks_like_classes(v: npt.NDArray[Any]) -> bool:
        return bool(np.all(v == np.round(v))) and float(v.max(initial=0.0)) > 1.0

    # Scores lie in 0..1 and come sorted; class ids are whole numbers, usually above 1.
    if looks_like_classes(a) and not looks_like_classes(b):
        classes, scores = a, b
    elif looks_like_classes(b) and not looks_like_classes(a):
        classes, scores = b, a
    else:
        classes, scores = a, b  # TFLite's documented order: boxes, classes, scores, count
    count = int(counts[0].reshape(-1)[0])
    return boxes[0][0], classes, scores, count


def decode_ssd(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
    """TFLite detection post-process outputs -> detections above `conf` (input pixels)."""
    boxes, classes, scores, count = _ssd_roles(outputs)
    count = max(0, min(count, boxes.shape[0]))
    boxes, classes, scores = boxes[:count], classes[:count], scores[:count]
    keep = scores > conf
    h, w = input_hw
    yxyx = boxes[keep]
    xyxy = np.stack([yxyx[:, 1] * w, yxyx[:, 0] * h, yxyx[:, 3] * w, yxyx[:, 2] * h], axis=1)
    return Detections(
        xyxy.astype(np.float32).reshape(-1, 4),
        scores[keep].astype(np.float32),
        np.rint(classes[keep]).astype(np.int32),
    )
