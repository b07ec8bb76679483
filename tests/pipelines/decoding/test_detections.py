"""`pipelines.decoding.detections`: shapes checked at construction, selection, empty and sorting."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoding.detections import Detections


@pytest.mark.parametrize(
    ("xyxy", "confidence", "class_id", "error"),
    [
        (np.zeros((2, 4), np.float32), np.zeros(2, np.float32), np.zeros(2, np.int32), None),
        (
            np.zeros((2, 3), np.float32),
            np.zeros(2, np.float32),
            np.zeros(2, np.int32),
            r"xyxy: expected shape \(_, 4\), got \(2, 3\)",
        ),
        (
            np.zeros(4, np.float32),
            np.zeros(1, np.float32),
            np.zeros(1, np.int32),
            r"xyxy: expected shape \(_, 4\), got \(4,\)",
        ),
        (
            np.zeros((2, 4), np.float32),
            np.zeros(3, np.float32),
            np.zeros(2, np.int32),
            r"confidence: expected shape \(2,\), got \(3,\)",
        ),
        (
            np.zeros((2, 4), np.float32),
            np.zeros(2, np.float32),
            np.zeros((2, 1), np.int32),
            r"class_id: expected shape \(2,\)",
        ),
        (
            np.zeros((2, 4), np.float64),
            np.zeros(2, np.float32),
            np.zeros(2, np.int32),
            "xyxy: expected dtype float32, got float64",
        ),
        (
            np.zeros((2, 4), np.float32),
            np.zeros(2, np.float32),
            np.zeros(2, np.int64),
            "class_id: expected dtype int32, got int64",
        ),
    ],
)
def test_construction_checks(xyxy, confidence, class_id, error) -> None:
    if error is None:
        assert len(Detections(xyxy, confidence, class_id)) == 2
    else:
        with pytest.raises(ValueError, match=error):
            Detections(xyxy, confidence, class_id)


def sample() -> Detections:
    return Detections.from_arrays([[0, 0, 10, 10], [5, 5, 15, 15], [20, 20, 30, 30]], [0.5, 0.9, 0.7], [1, 2, 1])


def test_selection_by_mask_and_index_returns_new_objects() -> None:
    d = sample()
    by_mask = d[d.class_id == 1]
    assert by_mask.confidence.tolist() == pytest.approx([0.5, 0.7])
    by_index = d[np.array([2])]
    assert by_index.xyxy.tolist() == [[20, 20, 30, 30]]
    assert len(d) == 3  # the original is untouched


def test_empty_and_sorting() -> None:
    empty = Detections.empty()
    assert (empty.xyxy.shape, empty.confidence.dtype, empty.class_id.dtype) == ((0, 4), np.float32, np.int32)
    assert sample().sorted_by_confidence().confidence.tolist() == pytest.approx([0.9, 0.7, 0.5])
