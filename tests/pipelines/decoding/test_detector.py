"""`pipelines.decoding.detector.Detector.postprocess`: boxes mapped back through the letterbox to
frame pixels; a box wholly inside the padding is dropped, one partly inside is clipped."""

from __future__ import annotations

import numpy as np

from pipelines.decoding.detector import Detector
from runtimes.registry import load_runtime

WIDE = np.full((32, 64, 3), 114, np.uint8)  # letterboxed into 64x64: 16 px of padding above and below


def test_a_box_wholly_inside_the_letterbox_padding_is_dropped(constant_model) -> None:
    """An end-to-end model (rows x1 y1 x2 y2 score class, tensor pixels) on a 64x32 frame: a box
    in the top padding maps to a zero-height box on the frame's edge and is left out; a box
    reaching into the image is clipped to it; one on the image is moved up by the padding."""
    rows = np.zeros((1, 10, 6), np.float32)
    rows[0, :3] = [
        [10, 2, 30, 12, 0.9, 0],  # all of it in the top padding (y 0..16)
        [10, 10, 30, 30, 0.8, 1],  # from the padding into the image
        [40, 20, 60, 40, 0.7, 2],  # on the image
    ]
    detector = Detector(load_runtime("onnxruntime", constant_model(rows)), "end2end")
    found = detector.detect(WIDE)
    assert found.class_id.tolist() == [1, 2], "the box in the padding is no detection"
    assert found.xyxy.tolist() == [[10.0, 0.0, 30.0, 14.0], [40.0, 4.0, 60.0, 24.0]]
    detector.close()
