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
