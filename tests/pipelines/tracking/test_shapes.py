"""`pipelines.tracking.shapes` on the shipped task models through ONNX Runtime: an outline that
lies on the mask, within its point bound; the keypoints and the oriented box as decoded; an
object event's JSON stays small."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from testkit import DEMO_MODELS

from agent.event_values import ObjectEvent
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.sources.synthetic import SyntheticScene
from pipelines.tracking.shapes import MAX_POLYGON_POINTS, ObjectShape, shape_of
from runtimes.registry import load_runtime


def _detect(name: str) -> Detections:
    image, _ = SyntheticScene(640, 480, num_shapes=5, seed=310_001).render(3)
    with load_runtime("onnxruntime", Path(DEMO_MODELS / name)) as runtime:
        return Detector(runtime).detect(image)


def _event(shape: ObjectShape | None) -> ObjectEvent:
    return ObjectEvent("end", 1.0, "cam0", "o1", 1, "circle", 0, 0.9, (1, 2, 3, 4), 7, 2.0, shape=shape)


def test_a_mask_outline_lies_on_its_mask_within_the_bound() -> None:
    found = _detect("demo_segment.onnx")
    assert len(found) >= 3 and found.masks is not None
    for i in range(len(found)):
        shape = shape_of(found, i)
        assert shape is not None and shape.polygons and not shape.keypoints and shape.obb is None
        assert sum(len(p) for p in shape.polygons) <= MAX_POLYGON_POINTS
        bitmap = found.masks.bitmap(i)
        part = np.array(shape.polygons[0])
        inside = np.zeros(bitmap.shape, np.uint8)

        cv2.fillPoly(inside, [np.round(part).astype(np.int32)], 1)
        overlap = (inside.astype(bool) & bitmap).sum() / max((inside.astype(bool) | bitmap).sum(), 1)
        assert overlap > 0.8, f"detection {i}: the outline covers its mask at IoU {overlap:.2f}"


def test_keypoints_and_oriented_boxes_are_the_decoded_ones() -> None:
    pose = _detect("demo_pose.onnx")
    assert len(pose) and pose.keypoints is not None
    shape = shape_of(pose, 0)
    assert shape is not None and shape.obb is None
    np.testing.assert_allclose(np.array(shape.keypoints), pose.keypoints[0], atol=1e-4)
    obb = _detect("demo_obb.onnx")
    assert len(obb) and obb.xywhr is not None
    shape = shape_of(obb, len(obb) - 1)
    assert shape is not None and shape.obb is not None
    np.testing.assert_allclose(shape.obb, obb.xywhr[-1], atol=1e-4)


def test_a_box_detection_has_no_shape_and_its_event_no_shape_key() -> None:
    assert shape_of(Detections.from_arrays([[0, 0, 5, 5]], [0.5], [0]), 0) is None
    assert "shape" not in _event(None).to_json()


def test_event_json_carries_the_shape_and_stays_bounded() -> None:
    worst = ObjectShape(
        polygons=(tuple((1000.123 + i, 2000.456 + i) for i in range(MAX_POLYGON_POINTS)),),
        keypoints=tuple((1000.123, 2000.456, 0.98765) for _ in range(17)),
        obb=(1000.0, 2000.0, 300.0, 400.0, 1.23456789),
    )
    document = _event(worst).to_json()
    shape = document["shape"]
    assert isinstance(shape, dict)
    assert shape["obb"] == {"cx": 1000.0, "cy": 2000.0, "w": 300.0, "h": 400.0, "angle": 1.2346}
    assert shape["keypoints"][0] == [1000.1, 2000.5, 0.9877]
    assert len(shape["polygons"][0]) == MAX_POLYGON_POINTS
    plain = len(json.dumps(_event(None).to_json()))
    assert len(json.dumps(document)) - plain < 1600, "a shape adds at most ~1.6 kB to an event"


def test_a_shape_over_its_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 32"):
        ObjectShape(polygons=(tuple((float(i), 0.0) for i in range(33)),))
