"""Which decoder fits a model: the table of every decoder, and the ranked candidates for ``auto``.

`decoder_candidates` ranks the decoders that could fit a model from its output shapes, what
its metadata says (`ModelHints`: class names, Ultralytics ``end2end`` / ``nms=True``, an
RT-DETR description) and, for files without metadata, the content of its outputs on a blank
frame (`pipelines.decoding.query_decoders.end2end_evidence`). The `Detector` then keeps the first
candidate whose detections pass the plausibility guard (`pipelines.decoding.plausibility`).

The shape ``(1, 300, 4+nc)`` (RT-DETR exports before Ultralytics 8.4) is also a YOLOv5-style
layout: RT-DETR is chosen only when the metadata names it (else ``--decoder rtdetr`` or the
manifest decides). Ultralytics 8.4's ``(1, 300, 6)`` RT-DETR rows (``cx, cy, w, h, score,
class``, normalised) are recognised by their content too.
Pure functions; safe from any thread.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy.typing as npt

from pipelines.decoding import query_decoders, task_decoders
from pipelines.decoding.decoders import (
    Decode,
    DecoderError,
    DecoderName,
    decode_ssd,
    decode_yolov5,
    decode_yolov8,
    decode_yolox,
    yolox_cells,
)
from pipelines.decoding.detections import Detections
from pipelines.decoding.tasks import Task, model_task
from runtimes.base import ModelMetadata

DECODERS: dict[DecoderName, Decode] = {
    "yolov8": decode_yolov8,
    "yolov5": decode_yolov5,
    "yolox": decode_yolox,
    "ssd": decode_ssd,
    "end2end": query_decoders.decode_end2end,
    "rtdetr": query_decoders.decode_rtdetr,
    "detr": query_decoders.decode_detr,
    "yolov8-seg": task_decoders.decode_yolov8_seg,
    "yolov8-pose": task_decoders.decode_yolov8_pose,
    "yolov8-obb": task_decoders.decode_yolov8_obb,
    "end2end-seg": task_decoders.decode_end2end_seg,
    "end2end-pose": task_decoders.decode_end2end_pose,
    "end2end-obb": task_decoders.decode_end2end_obb,
}
#: decoders whose detections are final (NMS inside the model, or one query per object): no NMS
NMS_FREE: frozenset[DecoderName] = frozenset(
    {"end2end", "rtdetr", "detr", "end2end-seg", "end2end-pose", "end2end-obb"}
)
#: the decoders of each task beyond boxes: (grid form, end-to-end form)
TASK_DECODERS: dict[Task, tuple[DecoderName, DecoderName]] = {
    "segment": ("yolov8-seg", "end2end-seg"),
    "pose": ("yolov8-pose", "end2end-pose"),
    "obb": ("yolov8-obb", "end2end-obb"),
}
#: decoders whose candidates are oriented boxes: rotated NMS (probabilistic IoU)
ROTATED: frozenset[DecoderName] = frozenset({"yolov8-obb", "end2end-obb"})
_RTDETR = re.compile(r"rt-?detr", re.IGNORECASE)


class Candidate(NamedTuple):
    """A decoder that could fit, and why it was considered."""

    name: DecoderName
    reason: str


@dataclass(frozen=True)
class ModelHints:
    """What a model's metadata says beyond its output shapes.

    `num_classes`: the count of class names; `end2end`: the exporter says the output is final
    detections; `rtdetr`: the exporter describes an RT-DETR model; `task`: the task the
    metadata names (Ultralytics' ``task``); `kpt_shape`: a pose model's ``(K, d)``.
    """

    num_classes: int | None = None
    end2end: bool = False
    rtdetr: bool = False
    task: str | None = None
    kpt_shape: tuple[int, int] | None = None

    @classmethod
    def from_metadata(cls, metadata: ModelMetadata) -> ModelHints:
        return cls(
            num_classes=len(metadata.names) if metadata.names else None,
            end2end=metadata.end2end,
            rtdetr=bool(metadata.description and _RTDETR.search(metadata.description)),
            task=metadata.task,
            kpt_shape=metadata.kpt_shape,
        )


def _query_candidates(
    shape: tuple[int, ...], input_hw: tuple[int, int], hints: ModelHints, sample: Sequence[npt.NDArray[Any]] | None
) -> list[Candidate]:
    """end2end and rtdetr for one output of (rows, values) = `shape`, from metadata or content.
    An output with one row per grid cell (or three, YOLOv5's anchors) is a grid head's."""
    rows, values = shape[-2:]
    cells = yolox_cells(input_hw)
    queries = len(shape) == 3 and rows <= query_decoders.MAX_QUERIES and rows not in (cells, 3 * cells)
    found = []
    if hints.rtdetr and values >= 5 and (values == 6 or hints.num_classes in (None, values - 4)):
        found.append(Candidate("rtdetr", f"output ({rows}, {values}) and metadata describing an RT-DETR model"))
    if queries and values in (6, 7):
        if hints.end2end:
            why = f"output ({rows}, {values}) and Ultralytics metadata: end2end or nms=True"
            found.append(Candidate("end2end", why))
        elif sample is not None and (evidence := query_decoders.end2end_evidence(sample)):
            found.append(Candidate("end2end", evidence))
        elif sample is not None and (evidence := query_decoders.rtdetr_evidence(sample)):
            found.append(Candidate("rtdetr", evidence))
    return found


def _grid_candidates(shape: tuple[int, ...], input_hw: tuple[int, int], num_classes: int | None) -> list[Candidate]:
    """yolov8, yolov5 and yolox for one output of shape (a, b)."""
    a, b = shape[-2:]
    if num_classes is not None:
        if a == 4 + num_classes and b > a:
            return [Candidate("yolov8", f"output (4+{num_classes}, {b}) with {num_classes} classes from metadata")]
        if b == 4 + num_classes and a > b:
            return [Candidate("yolov8", f"output ({a}, 4+{num_classes}) with {num_classes} classes from metadata")]
        if b == 5 + num_classes and a > b:
            # YOLOX exports carry no class names, so a model that does is YOLOv5-style.
            return [Candidate("yolov5", f"output ({a}, 5+{num_classes}) with objectness and class names in metadata")]
    if 5 <= a < b:
        return [Candidate("yolov8", f"output ({a}, {b}): 4 box rows and {a - 4} class rows")]
    if 6 <= b < a:
        if a == yolox_cells(input_hw):
            return [Candidate("yolox", f"output ({a}, {b}): one row per grid cell at strides 8/16/32")]
        return [Candidate("yolov5", f"output ({a}, {b}): box, objectness and {b - 5} class scores per row")]
    return []


def _is_detr(shapes: Sequence[tuple[int, ...]]) -> bool:
    if len(shapes) != 2 or any(len(s) != 3 for s in shapes):
        return False
    (_, qa, ca), (_, qb, cb) = shapes
    return qa == qb and 4 in (ca, cb)


def decoder_candidates(
    output_shapes: Sequence[tuple[int | None, ...]],
    input_hw: tuple[int, int],
    hints: ModelHints | None = None,
    sample: Sequence[npt.NDArray[Any]] | None = None,
) -> list[Candidate]:
    """The decoders that could fit a model, most likely first, each with the reason.

    `sample` is the model's outputs on one (blank) frame, dequantized: files without metadata
    are recognised as end-to-end by their content. Raises `DecoderError` naming the shapes when
    no decoder could fit.
    """
    hints = hints or ModelHints()
    shapes = [tuple(d if d is not None else -1 for d in s) for s in output_shapes]
    task = model_task(hints.task, shapes, hints.num_classes, hints.kpt_shape)
    if task == "classify":
        raise DecoderError(
            f"this is a classification model (output {shapes[0]}): it gives class scores for a whole image, "
            "not detections; use it as a classifier (pipelines.decoding.classifier), e.g. edge-agent detect prints "
            "its top classes"
        )
    if task in TASK_DECODERS:
        return [_task_candidate(task, shapes, hints)]
    found: list[Candidate] = []
    if len(shapes) == 4 and sum(len(s) == 3 and s[-1] == 4 for s in shapes) == 1:
        found.append(Candidate("ssd", "four outputs shaped like TFLite's detection post-process"))
    elif _is_detr(shapes):
        found.append(Candidate("detr", f"two outputs {shapes[0]} and {shapes[1]}: boxes (1, Q, 4) and class values"))
    elif len(shapes) == 1 and len(shapes[0]) in (2, 3):
        found += _query_candidates(shapes[0], input_hw, hints, sample)
        found += _grid_candidates(shapes[0], input_hw, hints.num_classes)
    if found:
        return [c for i, c in enumerate(found) if c.name not in {f.name for f in found[:i]}]
    expected = (
        "(1, 4+nc, N) for yolov8, (1, N, 5+nc) for yolov5/yolox, (1, K, 6) rows for end2end, "
        "(1, 300, 4+nc) for rtdetr, boxes (1, Q, 4) + class values (1, Q, C) for detr, "
        "or four TFLite post-process outputs for ssd"
    )
    text = ", ".join(str(tuple(s)) for s in output_shapes)
    if hints.num_classes is not None:
        text += f" (metadata names {hints.num_classes} classes)"
    raise DecoderError(f"model outputs match no decoder: found {text}; expected {expected}")


def _task_candidate(task: Task, shapes: Sequence[tuple[int, ...]], hints: ModelHints) -> Candidate:
    """The grid or end-to-end decoder of a segment, pose or obb model."""
    grid, end2end = TASK_DECODERS[task]
    pred = next(s for s in shapes if len(s) == 3)
    rows, values = pred[-2:]
    protos = next((s for s in shapes if len(s) == 4), None)
    e2e_values = {
        "segment": 6 + (min(protos[1], protos[3]) if protos else 32),
        "pose": 6 + (hints.kpt_shape[0] * hints.kpt_shape[1] if hints.kpt_shape else 51),
        "obb": 7,
    }[task]
    source = f"task {task!r} from metadata" if hints.task else f"{task} from the output shapes"
    if hints.end2end or (rows <= query_decoders.MAX_QUERIES and values == e2e_values and rows > values):
        why = "end2end in metadata" if hints.end2end else f"rows of {values} values"
        return Candidate(end2end, f"{source}, output {pred}: {why}")
    return Candidate(grid, f"{source}, output {pred}")


def choose_decoder(
    output_shapes: Sequence[tuple[int | None, ...]],
    input_hw: tuple[int, int],
    num_classes: int | None = None,
) -> Candidate:
    """The most likely decoder from output shapes alone (and the class count the metadata gives)."""
    return decoder_candidates(output_shapes, input_hw, ModelHints(num_classes))[0]


def decoder_for(name: DecoderName, sample: Sequence[npt.NDArray[Any]], hints: ModelHints) -> tuple[Decode, str]:
    """The decode function for `name`, set up for this model, and a note on how (empty if none):
    a ``detr`` model's score activation is decided from its `sample` outputs on a blank frame; a
    pose model's keypoints follow its ``kpt_shape`` (Ultralytics' COCO 17 x 3 when unknown)."""
    if name in ("yolov8-pose", "end2end-pose"):
        kpt_shape = hints.kpt_shape or task_decoders.DEFAULT_KPT_SHAPE
        pose = task_decoders.decode_yolov8_pose if name == "yolov8-pose" else task_decoders.decode_end2end_pose

        def decode_pose(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
            return pose(outputs, input_hw, conf, kpt_shape)

        return decode_pose, f"{kpt_shape[0]} keypoints of {kpt_shape[1]} values"
    if name != "detr":
        return DECODERS[name], ""
    try:
        mode, why = query_decoders.detr_scores(sample, hints.num_classes)
    except DecoderError:
        return DECODERS[name], ""  # the decoder itself will name what does not fit

    def decode(outputs: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float) -> Detections:
        return query_decoders.decode_detr(outputs, input_hw, conf, mode)

    return decode, f"{mode} scores ({why})"
