"""What a model does (its task), from its metadata first and its output shapes second.

Ultralytics writes ``task`` into every export's metadata: ``detect``, ``segment``, ``pose``,
``obb``, ``classify``, and tasks edge-agent does not decode (``semantic``, ``depth``, ...).
`model_task` trusts the metadata, and refuses:

- a task nobody here decodes, naming it (never guessed as boxes);
- outputs that contradict the task named (a ``pose`` model whose output has no room for its
  ``kpt_shape``, an ``obb`` model without its angle row, a ``segment`` model without
  prototypes, a ``classify`` model with more than one ``(1, nc)`` output), naming both;
- a grid output ``(1, 4+nc+k, N)`` with ``k > 0`` extra rows when the metadata names ``nc``
  classes but no task: the extra rows are a task's (an angle, keypoints), not classes, and
  reading them as boxes prints nonsense.

Without metadata, the shapes decide: two outputs of which one is 4-D are a segmentation model's,
one ``(1, nc)`` output a classifier's, anything else a box detector's (pose and obb exports
without metadata read as boxes; the plausibility guard then refuses what cannot be a score).
Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from pipelines.decoding.decoders import DecoderError

Task = Literal["detect", "segment", "pose", "obb", "classify"]
TASKS: tuple[Task, ...] = get_args(Task)
#: Ultralytics' tasks that no decoder here reads, and what they are
UNSUPPORTED = {
    "semantic": "semantic segmentation (a class map per pixel)",
    "depth": "depth estimation (a depth map)",
}


def _three_d(shapes: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    return [s for s in shapes if len(s) == 3]


def _contradiction(task: str, shapes: Sequence[tuple[int, ...]], expected: str) -> DecoderError:
    text = ", ".join(str(tuple(s)) for s in shapes)
    return DecoderError(f"the model's metadata names task {task!r} but its outputs {text} are not {expected}")


def _check_task_shapes(
    task: Task, shapes: Sequence[tuple[int, ...]], num_classes: int | None, kpt_shape: tuple[int, int] | None
) -> None:
    grids = _three_d(shapes)
    if task == "detect":
        return  # the box decoders' own shape rules apply
    if task == "classify":
        if len(shapes) != 1 or len(shapes[0]) != 2:
            raise _contradiction(task, shapes, "one (1, nc) output of class scores")
        if num_classes is not None and shapes[0][-1] not in (num_classes, -1):
            raise _contradiction(task, shapes, f"(1, {num_classes}) scores for its {num_classes} classes")
        return
    if task == "segment":
        if len(shapes) != 2 or len(grids) != 1 or sum(len(s) == 4 for s in shapes) != 1:
            raise _contradiction(task, shapes, "a prediction output (1, A, B) and prototypes (1, nm, h, w)")
        return
    if len(shapes) != 1 or len(grids) != 1:
        raise _contradiction(task, shapes, "one output (1, A, B)")
    if min(grids[0][1:]) < 0:
        return  # a dynamic axis (a file's declared shape): the decoder checks the real output
    values = min(grids[0][1:])  # per candidate: a grid's channels, or an end-to-end row
    if task == "obb":
        if values != 7 and values != 4 + (num_classes or values - 5) + 1:
            raise _contradiction(task, shapes, f"rows of 4 box values, {num_classes} class scores and an angle")
        return
    k, d = kpt_shape or (17, 3)
    fits = values == 6 + k * d or (
        values - 4 - k * d >= 1 if num_classes is None else values == 4 + num_classes + k * d
    )
    if not fits:
        classes = f"{num_classes} class scores" if num_classes is not None else "class scores"
        raise _contradiction(task, shapes, f"rows of 4 box values, {classes} and {k}x{d} keypoint values (kpt_shape)")


def model_task(
    task: str | None,
    output_shapes: Sequence[tuple[int | None, ...]],
    num_classes: int | None = None,
    kpt_shape: tuple[int, int] | None = None,
) -> Task:
    """The model's task from its metadata `task` (may be None), its output shapes, its class count
    and its ``kpt_shape`` (from metadata). Raises `DecoderError` as the module says."""
    shapes = [tuple(d if d is not None else -1 for d in s) for s in output_shapes]
    if task is not None:
        name = task.strip().lower()
        if name in UNSUPPORTED:
            raise DecoderError(
                f"the model's metadata names task {task!r}, {UNSUPPORTED[name]}: edge-agent decodes "
                f"{', '.join(TASKS)} models"
            )
        if name not in TASKS:
            raise DecoderError(
                f"the model's metadata names task {task!r}, which edge-agent does not decode "
                f"(it decodes {', '.join(TASKS)})"
            )
        known = next(t for t in TASKS if t == name)
        _check_task_shapes(known, shapes, num_classes, kpt_shape)
        return known
    if len(shapes) == 2 and sum(len(s) == 4 for s in shapes) == 1 and len(_three_d(shapes)) == 1:
        return "segment"
    if len(shapes) == 1 and len(shapes[0]) == 2 and 0 < shapes[0][-1] <= 100_000 and shapes[0][0] in (1, -1):
        return "classify"
    if num_classes is not None and len(shapes) == 1 and len(shapes[0]) == 3:
        a, b = shapes[0][1:]
        extra = a - 4 - num_classes
        if extra > 0 and a < b:
            raise DecoderError(
                f"the model's output {shapes[0]} has {extra} more row(s) than 4 box values and the "
                f"{num_classes} classes its metadata names, and the metadata names no task: an oriented-box, "
                "pose or segmentation export? Export it with its metadata (Ultralytics writes 'task'), or "
                "name the decoder (--decoder, or the manifest's decoder)"
            )
    return "detect"
