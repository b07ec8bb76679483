"""`pipelines.decoding.nms`: IoU and NMS, class-aware, at the threshold exactly, against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoding.detections import Detections
from pipelines.decoding.nms import box_iou, class_aware_nms, nms_indices


def test_box_iou_known_values() -> None:
    box = np.array([0, 0, 10, 10], np.float32)
    boxes = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30], [0, 0, 0, 0]], np.float32)
    np.testing.assert_allclose(box_iou(box, boxes), [1.0, 50 / 150, 0.0, 0.0], rtol=1e-6)


def test_nms_keeps_best_of_overlapping_and_respects_max_det() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [51, 51, 61, 61]], np.float32)
    scores = np.array([0.6, 0.9, 0.8, 0.3], np.float32)
    assert nms_indices(boxes, scores, 0.5).tolist() == [1, 2]
    assert nms_indices(boxes, scores, 0.5, max_det=1).tolist() == [1]
    assert nms_indices(boxes, scores, 0.99).tolist() == [1, 2, 0, 3]


def test_class_aware_nms_never_suppresses_across_classes() -> None:
    d = Detections.from_arrays([[0, 0, 10, 10], [0, 0, 10, 10], [0.5, 0, 10, 10]], [0.9, 0.8, 0.7], [0, 1, 0])
    kept = class_aware_nms(d, 0.5, 300)
    assert kept.class_id.tolist() == [0, 1]
    assert kept.confidence.tolist() == pytest.approx([0.9, 0.8])


def test_class_aware_nms_with_negative_coordinates() -> None:
    d = Detections.from_arrays([[-20, -20, 5, 5], [-19, -19, 5, 5]], [0.9, 0.8], [3, 0])
    assert len(class_aware_nms(d, 0.5, 300)) == 2


def reference_nms(boxes, scores, classes, thr):
    """Plain-Python greedy NMS, one box at a time, for cross-checking."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    kept: list[int] = []
    for i in order:
        if all(classes[i] != classes[k] or box_iou(boxes[k], boxes[i : i + 1])[0] <= thr for k in kept):
            kept.append(i)
    return kept


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_nms_matches_the_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 100, (300, 2)).astype(np.float32)
    wh = rng.uniform(5, 40, (300, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + wh], axis=1)
    scores = rng.uniform(0, 1, 300).astype(np.float32)
    classes = rng.integers(0, 4, 300).astype(np.int32)
    expected = reference_nms(boxes, scores, classes, 0.45)
    assert nms_indices(boxes, scores, 0.45, class_id=classes).tolist() == expected
    assert nms_indices(boxes, scores, 0.45, max_det=7, class_id=classes).tolist() == expected[:7]


@pytest.mark.parametrize(
    ("other", "iou"),
    [
        ([20, 0, 30, 10], 0.0),  # apart along x only (the y overlap must not count)
        ([0, 20, 10, 30], 0.0),  # apart along y only
        ([10, 0, 20, 10], 0.0),  # touching edges
        ([9.5, 0, 19.5, 10], 5 / 195),  # half a pixel of overlap
        ([0, 0, 0, 0], 0.0),  # a box of no area
    ],
)
def test_box_iou_edges(other: list[float], iou: float) -> None:
    found = box_iou(np.array([0, 0, 10, 10], np.float32), np.array([other], np.float32))
    assert found.dtype == np.float32
    assert found[0] == pytest.approx(iou, abs=1e-7)


def test_box_iou_of_tiny_and_of_empty_boxes() -> None:
    """Boxes under a pixel still have an IoU; two boxes of no area have none (0, not 1)."""
    tiny = np.array([0, 0, 0.5, 0.5], np.float32)
    assert box_iou(tiny, tiny[None])[0] == pytest.approx(1.0)
    empty = np.zeros(4, np.float32)
    assert box_iou(empty, empty[None])[0] == 0.0


def test_nms_keeps_boxes_that_only_touch_and_keeps_score_ties_in_order() -> None:
    side_by_side = np.array([[0, 0, 10, 10], [10, 0, 20, 10], [25, 0, 35, 10]], np.float32)
    assert nms_indices(side_by_side, np.array([0.9, 0.8, 0.7], np.float32), 0.0).tolist() == [0, 1, 2]
    apart = np.array([[30 * i, 0, 30 * i + 10, 10] for i in range(60)], np.float32)
    assert nms_indices(apart, np.full(60, 0.5, np.float32), 0.5).tolist() == list(range(60))


def test_nms_keeps_a_box_exactly_at_the_threshold() -> None:
    """A box is dropped only when its IoU *exceeds* the threshold (Ultralytics' rule too)."""
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 20]], np.float32)  # IoU exactly 100 / 200
    assert box_iou(boxes[0], boxes[1:])[0] == 0.5
    assert nms_indices(boxes, np.array([0.9, 0.8], np.float32), 0.5).tolist() == [0, 1]
    assert nms_indices(boxes, np.array([0.9, 0.8], np.float32), 0.49).tolist() == [0]


def test_nms_limit_keeps_the_same_best_detections() -> None:
    rng = np.random.default_rng(4)
    xy = rng.uniform(0, 600, (2000, 2)).astype(np.float32)
    xyxy = np.concatenate([xy, xy + rng.uniform(5, 40, (2000, 2)).astype(np.float32)], axis=1)
    scores = rng.uniform(0, 1, 2000).astype(np.float32)
    classes = rng.integers(0, 3, 2000).astype(np.int32)
    full = nms_indices(xyxy, scores, 0.45, None, classes)
    for limit in (1, 10, 300):
        assert nms_indices(xyxy, scores, 0.45, limit, classes).tolist() == full[:limit].tolist()
