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


def _task_detections() -> Detections:
    from pipelines.decoding.masks import Masks

    xyxy = np.array([[0, 0, 10, 10], [5, 5, 20, 20], [1, 2, 3, 4]], np.float32)
    masks = Masks(np.arange(6, dtype=np.float32).reshape(3, 2), np.zeros((2, 4, 4), np.float32), xyxy, (16, 16))
    keypoints = np.arange(27, dtype=np.float32).reshape(3, 3, 3)
    xywhr = np.arange(15, dtype=np.float32).reshape(3, 5)
    return Detections(
        xyxy,
        np.array([0.2, 0.9, 0.5], np.float32),
        np.array([0, 1, 2], np.int32),
        masks=masks,
        keypoints=keypoints,
        xywhr=xywhr,
    )


def test_task_fields_are_selected_together() -> None:
    d = _task_detections()
    for picked in (d.sorted_by_confidence(), d[np.array([1, 2, 0])]):
        assert picked.class_id.tolist() == [1, 2, 0]
        assert picked.keypoints is not None and picked.keypoints[:, 0, 0].tolist() == [9, 18, 0]
        assert picked.xywhr is not None and picked.xywhr[:, 0].tolist() == [5, 10, 0]
        assert picked.masks is not None and picked.masks.coefficients[:, 0].tolist() == [2, 4, 0]
        assert picked.masks.boxes[:, 0].tolist() == [5, 1, 0]
    one = d[np.array([False, True, False])]
    assert one.keypoints is not None and one.keypoints.shape == (1, 3, 3)
    assert one.xywhr is not None and one.xywhr.shape == (1, 5)
    tracked = d.with_tracker_id([4, 5, 6])
    assert tracked.masks is d.masks and tracked.keypoints is d.keypoints and tracked.xywhr is d.xywhr


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("keypoints", np.zeros((2, 3, 3), np.float32), r"keypoints: expected shape \(3, K, 2 or 3\)"),
        ("keypoints", np.zeros((3, 3, 4), np.float32), r"keypoints: expected shape \(3, K, 2 or 3\)"),
        ("keypoints", np.zeros((3, 3, 3), np.float64), "keypoints: expected dtype float32"),
        ("xywhr", np.zeros((3, 4), np.float32), r"xywhr: expected shape \(3, 5\)"),
        ("xywhr", np.zeros((3, 5), np.float64), "xywhr: expected dtype float32"),
    ],
)
def test_task_fields_are_checked(field: str, value: np.ndarray, error: str) -> None:
    d = _task_detections()
    with pytest.raises(ValueError, match=error):
        Detections(d.xyxy, d.confidence, d.class_id, **{field: value})


def test_masks_must_match_the_detections() -> None:
    d = _task_detections()
    assert d.masks is not None
    with pytest.raises(ValueError, match="masks: expected 3 masks, got 2"):
        Detections(d.xyxy, d.confidence, d.class_id, masks=d.masks[np.array([0, 1])])
