"""`pipelines.decoding.detector.Detector.postprocess`: boxes mapped back through the letterbox to
frame pixels; a box wholly inside the padding is dropped, one partly inside is clipped; keypoints
and oriented boxes mapped back with each axis's own scale and padding."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector, to_source
from pipelines.decoding.preprocess import Transform
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


def test_keypoints_and_oriented_boxes_map_back_with_each_axis_own_scale_and_padding() -> None:
    """A transform whose axes differ in scale and in padding (a stretch and a pad): keypoints,
    oriented boxes and boxes map back to the frame each axis with its own. Catches a planted
    swap of the axes in `to_source` (x through `scale_y`/`pad_y`), which a letterbox's one
    scale for both axes hides."""
    transform = Transform(scale_x=0.5, scale_y=0.25, pad_x=10, pad_y=40, source_hw=(400, 600), input_hw=(160, 320))
    found = to_source(
        Detections(
            np.array([[60, 70, 110, 90]], np.float32),
            np.array([0.9], np.float32),
            np.array([0], np.int32),
            keypoints=np.array([[[60, 70, 0.8]]], np.float32),
            xywhr=np.array([[60, 70, 50, 20, 0.3]], np.float32),
        ),
        transform,
    )
    assert found.xyxy.tolist() == [[100, 120, 200, 200]]
    assert found.keypoints is not None and found.keypoints.tolist() == [[[100, 120, pytest.approx(0.8)]]]
    assert found.xywhr is not None
    np.testing.assert_allclose(found.xywhr, [[100, 120, 100, 80, 0.3]], rtol=1e-6)
