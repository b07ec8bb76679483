"""`pipelines.decoding.tasks`: the metadata's task first, the shapes second; tasks nobody decodes
and outputs contradicting the task refused, naming them."""

from __future__ import annotations

import pytest

from pipelines.decoding.decoder_choice import ModelHints, decoder_candidates
from pipelines.decoding.decoders import DecoderError
from pipelines.decoding.tasks import model_task


@pytest.mark.parametrize(
    ("task", "shapes", "nc", "kpt", "expected"),
    [
        ("segment", [(1, 116, 8400), (1, 32, 160, 160)], 80, None, "segment"),
        ("segment", [(1, 32, 160, 160), (1, 300, 38)], 80, None, "segment"),  # any order
        ("pose", [(1, 56, 8400)], 1, (17, 3), "pose"),
        ("pose", [(1, 300, 57)], 1, (17, 3), "pose"),
        ("obb", [(1, 20, 21504)], 15, None, "obb"),
        ("obb", [(1, 300, 7)], 15, None, "obb"),
        ("classify", [(1, 1000)], 1000, None, "classify"),
        ("detect", [(1, 84, 8400)], 80, None, "detect"),
        ("pose", [(None, None, 8400)], 1, (17, 3), "pose"),  # a file's dynamic axes: not contradicting
        ("classify", [(None, None)], 3, None, "classify"),
        (None, [(1, 116, 8400), (1, 32, 160, 160)], None, None, "segment"),
        (None, [(1, 1000)], None, None, "classify"),
        (None, [(1, 84, 8400)], 80, None, "detect"),
        (None, [(1, 8400, 85)], 80, None, "detect"),  # YOLOv5-style objectness: rows last
        (None, [(1, 85, 8400)], None, None, "detect"),  # no names, no task: the guard decides
    ],
)
def test_the_task_from_metadata_then_shapes(
    task: str | None, shapes: list, nc: int | None, kpt: tuple | None, expected: str
) -> None:
    assert model_task(task, shapes, nc, kpt) == expected


@pytest.mark.parametrize("task", ["semantic", "depth", "Depth"])
def test_a_task_nobody_decodes_is_refused_by_name(task: str) -> None:
    with pytest.raises(DecoderError, match=rf"task '{task}'.*edge-agent decodes detect, segment, pose, obb"):
        model_task(task, [(1, 19, 160, 160)], 19)


def test_an_unknown_task_is_refused_by_name() -> None:
    with pytest.raises(DecoderError, match=r"task 'caption', which edge-agent does not decode"):
        model_task("caption", [(1, 84, 8400)], 80)


@pytest.mark.parametrize(
    ("task", "shapes", "nc", "kpt", "named"),
    [
        ("obb", [(1, 84, 8400)], 80, None, r"task 'obb' but its outputs \(1, 84, 8400\).*80 class scores and an angle"),
        ("pose", [(1, 84, 8400)], 1, (17, 3), r"task 'pose' but its outputs \(1, 84, 8400\).*17x3 keypoint"),
        ("segment", [(1, 116, 8400)], 80, None, r"task 'segment' but its outputs \(1, 116, 8400\).*prototypes"),
        ("classify", [(1, 84, 8400)], 80, None, r"task 'classify' but its outputs \(1, 84, 8400\)"),
        ("classify", [(1, 10)], 3, None, r"task 'classify' but its outputs \(1, 10\).*\(1, 3\)"),
    ],
)
def test_outputs_contradicting_the_task_are_refused_naming_both(
    task: str, shapes: list, nc: int, kpt: tuple | None, named: str
) -> None:
    with pytest.raises(DecoderError, match=named):
        model_task(task, shapes, nc, kpt)


def test_extra_rows_beyond_the_named_classes_without_a_task_are_refused() -> None:
    """yolo11n-obb's (1, 85, 2100) with its 80 names but no task: never read as 81 classes."""
    with pytest.raises(DecoderError, match=r"\(1, 85, 2100\) has 1 more row.*80 classes.*names no task"):
        model_task(None, [(1, 85, 2100)], 80)


def test_an_obb_export_never_gets_a_box_decoder() -> None:
    hints = ModelHints(num_classes=80, task="obb")
    assert [c.name for c in decoder_candidates([(1, 85, 2100)], (320, 320), hints)] == ["yolov8-obb"]
    hints = ModelHints(num_classes=80, task="obb", end2end=True)
    assert [c.name for c in decoder_candidates([(1, 300, 7)], (320, 320), hints)] == ["end2end-obb"]


@pytest.mark.parametrize(
    ("shapes", "hints", "expected"),
    [
        ([(1, 39, 2100), (1, 32, 80, 80)], ModelHints(3, task="segment"), "yolov8-seg"),
        ([(1, 80, 80, 32), (1, 300, 38)], ModelHints(3, task="segment"), "end2end-seg"),
        ([(1, 14, 2100)], ModelHints(1, task="pose", kpt_shape=(3, 3)), "yolov8-pose"),
        ([(1, 300, 15)], ModelHints(1, task="pose", kpt_shape=(3, 3), end2end=True), "end2end-pose"),
        ([(1, 300, 15)], ModelHints(1, task="pose", kpt_shape=(3, 3)), "end2end-pose"),  # rows of 6 + 9
        ([(1, 2100, 8)], ModelHints(3, task="obb"), "yolov8-obb"),  # transposed grid
    ],
)
def test_the_task_decoder_from_the_shapes(shapes: list, hints: ModelHints, expected: str) -> None:
    assert decoder_candidates(shapes, (320, 320), hints)[0].name == expected


def test_a_classifier_is_not_given_a_detection_decoder() -> None:
    with pytest.raises(DecoderError, match=r"classification model \(output \(1, 3\)\)"):
        decoder_candidates([(1, 3)], (64, 64), ModelHints(3, task="classify"))
