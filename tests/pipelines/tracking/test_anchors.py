"""The anchors of lines and zones: a case table over the tasks' detections."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame
from pipelines.tracking.analytics import SceneAnalytics
from pipelines.tracking.anchors import AnchorSpec, anchor_points, parse_anchor
from pipelines.tracking.zones import LineSpec, ZoneSpec

BOX = np.array([[10, 20, 50, 100]], np.float32)  # centre (30, 60), bottom centre (30, 100)


def _pose(kpts: list[list[float]]) -> Detections:
    base = Detections.from_arrays(BOX, [0.9], [0])
    return Detections(base.xyxy, base.confidence, base.class_id, keypoints=np.array([kpts], np.float32))


def _obb() -> Detections:
    base = Detections.from_arrays(BOX, [0.9], [0])
    return Detections(base.xyxy, base.confidence, base.class_id, xywhr=np.array([[33, 57, 40, 20, 0.3]], np.float32))


POSE = [[0, 0, 0.9], [12, 90, 0.9], [20, 96, 0.8], [40, 98, 0.3]]

CASES = [
    ("center", None, (30.0, 60.0)),
    ("bottom_center", None, (30.0, 100.0)),
    ("obb_center", None, (30.0, 60.0)),  # no oriented boxes: the box centre
    ("obb_center", _obb(), (33.0, 57.0)),
    ("center", _obb(), (30.0, 60.0)),
    ("keypoints:1,2", _pose(POSE), (16.0, 93.0)),  # both seen: their midpoint
    ("keypoints:1,3", _pose(POSE), (12.0, 90.0)),  # 3 scores 0.3: only 1
    ("keypoints:2", _pose(POSE), (20.0, 96.0)),
    ("keypoints:3", _pose(POSE), (30.0, 100.0)),  # none seen: the bottom centre
    ("keypoints:1,2", None, (30.0, 100.0)),  # a box detector: the bottom centre
    ("keypoints:0, 1", _pose([[4, 6, 0.5], [8, 10, 0.5]]), (6.0, 8.0)),  # 0.5 is enough
]


@pytest.mark.parametrize(("text", "detections", "expected"), CASES)
def test_anchor_point(text: str, detections: Detections | None, expected: tuple[float, float]) -> None:
    points = anchor_points(parse_anchor(text), BOX, detections)
    assert points.shape == (1, 2)
    np.testing.assert_allclose(points[0], expected)


def test_anchor_text_round_trips() -> None:
    assert parse_anchor(" keypoints:15,16 ") == AnchorSpec("keypoints", (15, 16))
    assert str(parse_anchor("keypoints:15,16")) == "keypoints:15,16"
    assert str(parse_anchor("bottom_center")) == "bottom_center"


@pytest.mark.parametrize("text", ["middle", "keypoints:", "keypoints:a,1", "keypoints:-1", "keypoints"])
def test_bad_anchor_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="anchor"):
        parse_anchor(text)


def test_keypoint_beyond_the_model_is_named() -> None:
    with pytest.raises(ValueError, match="4 keypoints"):
        anchor_points(parse_anchor("keypoints:4"), BOX, _pose(POSE))


def test_empty_frame() -> None:
    empty = Detections.empty()
    assert anchor_points(parse_anchor("keypoints:1"), empty.xyxy, empty).shape == (0, 2)


def test_a_line_counts_with_its_own_anchor() -> None:
    """A still box (centre y = 200) whose keypoint walks down across y = 240: the line on the
    keypoint counts it, the same line on the camera's centre anchor does not."""
    feet = LineSpec("feet", (0, 240), (640, 240), parse_anchor("keypoints:0"))
    middle = LineSpec("middle", (0, 240), (640, 240))
    zone = ZoneSpec("floor", ((0, 260), (640, 260), (640, 480), (0, 480)), anchor=parse_anchor("keypoints:0"))
    analytics = SceneAnalytics("cam0", lines=[feet, middle], zones=[zone])
    image = np.zeros((480, 640, 3), np.uint8)
    for index in range(40):
        y = 200.0 if index < 10 else min(200.0 + 5 * (index - 10), 290.0)
        base = Detections.from_arrays([[300, 100, 340, 300]], [0.9], [0])
        pose = Detections(base.xyxy, base.confidence, base.class_id, keypoints=np.array([[[320, y, 0.9]]], np.float32))
        analytics.update(Frame(index, index / 15, image), pose)
    counts = {c.name: (c.forward, c.backward) for c in analytics.counts().lines}
    assert counts == {"feet": (1, 0), "middle": (0, 0)}
    assert analytics.counts().zones[0].total == 1
