"""`pipelines.decoding.decoder_choice`: which decoder fits a model, ranked candidates, refusals naming the shapes."""

from __future__ import annotations

import numpy as np
import pytest
from testkit.decoder_outputs import E2E_META, HW, RTDETR_META, end2end_output, rtdetr_output, rtdetr_rows

from pipelines.decoding.decoder_choice import ModelHints, choose_decoder, decoder_candidates
from pipelines.decoding.decoders import (
    DecoderError,
)
from runtimes.metadata import parse_metadata


@pytest.mark.parametrize(
    ("shapes", "hw", "nc", "expected"),
    [
        ([(1, 84, 8400)], (640, 640), None, "yolov8"),
        ([(1, 84, 8400)], (640, 640), 80, "yolov8"),
        ([(1, 8400, 84)], (640, 640), 80, "yolov8"),
        ([(1, 5, 2100)], (320, 320), 1, "yolov8"),
        ([(1, 25200, 85)], (640, 640), None, "yolov5"),
        ([(1, 25200, 85)], (640, 640), 80, "yolov5"),
        ([(1, 3549, 85)], (416, 416), None, "yolox"),
        ([(1, 3549, 85)], (416, 416), 80, "yolov5"),  # named classes: not a YOLOX export
        ([(1, 10, 4), (1, 10), (1, 10), (1,)], (300, 300), None, "ssd"),
        ([(1, 25), (1, 25, 4), (1,), (1, 25)], (320, 320), None, "ssd"),
    ],
)
def test_choose_decoder(shapes, hw, nc, expected) -> None:
    name, reason = choose_decoder(shapes, hw, nc)
    assert name == expected
    # the reason names what decided it: the output's layout (its anchor count), or SSD's four outputs
    assert ("four outputs" if expected == "ssd" else f"{max(shapes[0][1:])}") in reason, reason


@pytest.mark.parametrize(
    "shapes",
    [[(1, 10), (1,)], [(1, 3, 4)]],
)
def test_choose_decoder_names_the_shapes_it_found(shapes) -> None:
    with pytest.raises(DecoderError, match=r"match no decoder: found \(1,"):
        choose_decoder(shapes, (640, 640))


def test_a_classifier_output_and_prototypes_are_told_apart() -> None:
    """(1, 1000) is a classifier's (refused as detections); a grid with prototypes a segmenter's."""
    with pytest.raises(DecoderError, match=r"classification model \(output \(1, 1000\)\)"):
        choose_decoder([(1, 1000)], (640, 640))
    assert choose_decoder([(1, 84, 8400), (1, 32, 160, 160)], (640, 640)).name == "yolov8-seg"


@pytest.mark.parametrize(
    ("shapes", "hints", "sample", "expected"),
    [
        ([(1, 300, 6)], E2E_META, None, ["end2end", "yolov5"]),
        ([(1, 300, 6)], ModelHints(), [end2end_output()], ["end2end", "yolov5"]),
        ([(1, 300, 7)], ModelHints(), [end2end_output(batch_index=True)], ["end2end", "yolov5"]),
        ([(1, 300, 6)], ModelHints(), [rtdetr_output()], ["yolov5"]),  # ambiguous: --decoder rtdetr decides
        ([(1, 300, 6)], RTDETR_META, [rtdetr_output()], ["rtdetr", "yolov8"]),
        ([(1, 300, 6)], ModelHints(num_classes=80, rtdetr=True), [rtdetr_rows()], ["rtdetr", "yolov5"]),
        ([(1, 300, 6)], ModelHints(), [rtdetr_rows()], ["rtdetr", "yolov5"]),  # 8.4 rows: by content
        ([(1, 300, 84)], ModelHints(num_classes=80, rtdetr=True), None, ["rtdetr", "yolov8"]),
        ([(1, 8400, 6)], ModelHints(num_classes=2), [np.zeros((1, 8400, 6), np.float32)], ["yolov8"]),  # a grid
        ([(1, 2100, 6)], ModelHints(), [np.zeros((1, 2100, 6), np.float32)], ["yolox"]),  # 320x320 grid cells
        ([(1, 300, 4), (1, 300, 91)], ModelHints(), None, ["detr"]),
        ([(1, 100, 92), (1, 100, 4)], ModelHints(), None, ["detr"]),
        ([(1, 84, 8400)], E2E_META, None, ["yolov8"]),
    ],
)
def test_decoder_candidates(shapes, hints, sample, expected) -> None:
    hw = (320, 320) if shapes == [(1, 2100, 6)] else HW
    found = decoder_candidates(shapes, hw, hints, sample)
    assert [c.name for c in found] == expected
    assert all(c.reason for c in found)


def test_no_candidate_names_the_shapes_and_the_layouts() -> None:
    with pytest.raises(DecoderError, match=r"found \(1, 300, 3\).*\(1, K, 6\) rows for end2end"):
        decoder_candidates([(1, 300, 3)], HW)


@pytest.mark.parametrize(
    ("raw", "end2end"),
    [
        ({"end2end": "True"}, True),
        ({"end2end": "False", "args": "{'batch': 1, 'nms': True}"}, True),
        ({"end2end": "False", "args": "{'batch': 1, 'nms': False}"}, False),
        ({"end2end": True}, True),  # a TFLite metadata.json: real booleans
        ({"args": {"nms": True}}, True),
        ({"args": "not a dict"}, False),
        ({}, False),
    ],
)
def test_metadata_end2end_flag(raw, end2end) -> None:
    assert parse_metadata(raw).end2end is end2end
