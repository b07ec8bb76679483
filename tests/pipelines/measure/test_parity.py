"""`pipelines.measure.parity`: detection agreement and the max abs error."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoding.detections import Detections
from pipelines.measure.parity import detection_agreement, max_abs_error
from runtimes.base import TensorSpec


def boxes(*rows: tuple[float, float, float, float, int]) -> Detections:
    return Detections.from_arrays([r[:4] for r in rows], [0.9] * len(rows), [r[4] for r in rows])


@pytest.mark.parametrize(
    ("found", "reference", "agreement"),
    [
        (boxes(), boxes(), 1.0),
        (boxes((0, 0, 10, 10, 1)), boxes((0, 0, 10, 10, 1)), 1.0),
        (boxes((1, 1, 11, 11, 1)), boxes((0, 0, 10, 10, 1)), 1.0),  # IoU 0.68
        (boxes((5, 5, 15, 15, 1)), boxes((0, 0, 10, 10, 1)), 0.0),  # IoU 0.14
        (boxes((0, 0, 10, 10, 2)), boxes((0, 0, 10, 10, 1)), 0.0),  # another label
        (boxes((0, 0, 10, 10, 1), (20, 20, 30, 30, 1)), boxes((0, 0, 10, 10, 1)), 0.5),  # one extra box
        (boxes(), boxes((0, 0, 10, 10, 1)), 0.0),
    ],
)
def test_detection_agreement(found: Detections, reference: Detections, agreement: float) -> None:
    assert detection_agreement(found, reference) == agreement


def test_max_abs_error_dequantizes_and_refuses_other_shapes() -> None:
    from runtimes.base import Quantization

    spec = TensorSpec("out", (1, 3), np.dtype(np.int8), quantization=Quantization(0.5, 0))
    got, want = np.array([[2, 4, 6]], np.int8), np.array([[2, 4, 8]], np.int8)
    assert max_abs_error([got], [want], [spec]) == 1.0
    assert max_abs_error([got], [np.zeros((1, 4), np.int8)], [spec]) is None
