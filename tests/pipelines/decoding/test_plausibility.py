"""`pipelines.decoding.plausibility`: the guard against impossible answers, and blank-frame survivors."""

from __future__ import annotations

import numpy as np
import pytest
from testkit.decoder_outputs import HW

from pipelines.decoding.detections import Detections
from pipelines.decoding.plausibility import blank_frame_problems, problems


def dets(rows: list[tuple[float, ...]]) -> Detections:
    array = np.asarray(rows, np.float32).reshape(-1, 6)
    return Detections.from_arrays(array[:, :4], array[:, 4], array[:, 5])


@pytest.mark.parametrize(
    ("rows", "wrong"),
    [
        ([(10, 10, 50, 50, 0.9, 0), (0, 0, 640, 640, 1.0, 1)], None),
        ([(10, 10, 50, 50, 1.005, 0)], None),  # rounding
        ([], None),
        ([(10, 10, 50, 50, 12.84, 0), (10, 10, 50, 50, 0.5, 0)], "1 of 2 scores outside [0, 1] (from 0.5 to 12.84)"),
        ([(50, 10, 10, 50, 0.9, 0)] * 2 + [(10, 10, 50, 50, 0.9, 0)], "2 of 3 boxes are wrong: 2 inverted"),
        ([(50, 10, 10, 50, 0.9, 0), (10, 10, 50, 50, 0.9, 0)], None),  # one of two: not most
        ([(700, 700, 900, 900, 0.9, 0)], "mostly outside the 640x640 input"),
        ([(600, 600, 700, 700, 0.9, 0)], "1 mostly outside"),  # 40x40 of 100x100 inside
        ([(600, 600, 650, 650, 0.9, 0)], None),  # 40x40 of 50x50 inside
        ([(float("nan"), 0, 10, 10, 0.9, 0)], "1 not finite"),
    ],
)
def test_plausibility_guard(rows, wrong) -> None:
    found = problems(dets(rows), HW)
    if wrong is None:
        assert found == []
    else:
        assert found and wrong in " ".join(found), found


def test_blank_frame_survivors() -> None:
    assert blank_frame_problems(300, 300) == []
    assert blank_frame_problems(301, 300) == ["301 detections survive on a blank frame, more than max_det 300"]


def _boxes(n: int) -> Detections:
    return dets([(10.0 + i, 10.0, 60.0 + i, 50.0, 0.9, 0) for i in range(n)])


@pytest.mark.parametrize(
    ("field", "value", "wrong"),
    [
        ("keypoints", np.full((3, 2, 3), 0.5, np.float32), None),
        ("keypoints", np.array([[[5, 5, 3.7]] * 2] * 3, np.float32), "keypoint scores outside [0, 1]"),
        ("keypoints", np.array([[[np.nan, 5, 0.5]] * 2] * 3, np.float32), "keypoints not finite"),
        ("xywhr", np.array([[30, 30, 20, 10, 0.3]] * 3, np.float32), None),
        ("xywhr", np.array([[30, 30, 0, 10, 0.3]] * 3, np.float32), "oriented boxes are of no size"),
        ("xywhr", np.array([[30, 30, 1e6, 10, 0.3]] * 3, np.float32), "longer than 4 input diagonals"),
        ("xywhr", np.array([[30, 30, 20, 10, 0.3]] * 2 + [[30, 30, -1, 10, 0.3]], np.float32), None),  # a minority
    ],
)
def test_task_values_no_task_head_gives(field: str, value: np.ndarray, wrong: str | None) -> None:
    d = _boxes(3)
    found = problems(Detections(d.xyxy, d.confidence, d.class_id, **{field: value}), HW)
    assert (wrong is None and found == []) or any(wrong in f for f in found), found


@pytest.mark.parametrize(("coefficient", "wrong"), [(3.0, False), (np.inf, True), (2e4, True)])
def test_mask_coefficients_of_a_segmentation_head(coefficient: float, wrong: bool) -> None:
    from pipelines.decoding.masks import Masks

    d = _boxes(2)
    masks = Masks(np.full((2, 4), coefficient, np.float32), np.zeros((4, 8, 8), np.float32), d.xyxy, HW)
    found = problems(Detections(d.xyxy, d.confidence, d.class_id, masks=masks), HW)
    assert any("mask coefficients" in f for f in found) == wrong, found
