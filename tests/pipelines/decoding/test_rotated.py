"""`pipelines.decoding.rotated`: probabilistic IoU against an independent matrix formula, the
fast-NMS rule of Ultralytics' rotated NMS, blocks, classes, corners."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoding import rotated
from pipelines.decoding.rotated import corners, hull_xyxy, probiou, rotated_nms_indices


def _covariance(box: np.ndarray) -> np.ndarray:
    w, h, angle = box[2], box[3], box[4]
    r = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    return r @ np.diag([w * w / 12, h * h / 12]) @ r.T


def _reference(a: np.ndarray, b: np.ndarray) -> float:
    """1 - Hellinger distance of the two boxes' Gaussians, by matrix algebra (Bhattacharyya)."""
    s1, s2 = _covariance(a.astype(np.float64)), _covariance(b.astype(np.float64))
    mean = (s1 + s2) / 2
    delta = (a[:2] - b[:2]).astype(np.float64)
    distance = delta @ np.linalg.inv(mean) @ delta / 8 + 0.5 * np.log(
        np.linalg.det(mean) / np.sqrt(np.linalg.det(s1) * np.linalg.det(s2))
    )
    return float(1 - np.sqrt(1 - np.exp(-distance)))


def test_probiou_is_the_hellinger_overlap_of_the_boxes_gaussians() -> None:
    rng = np.random.default_rng(3)
    a = np.column_stack(
        [
            rng.uniform(0, 50, 20),
            rng.uniform(0, 50, 20),
            rng.uniform(5, 40, 20),
            rng.uniform(5, 40, 20),
            rng.uniform(-1, 2.5, 20),
        ]
    ).astype(np.float32)
    b = a + rng.normal(0, [4, 4, 3, 3, 0.4], a.shape).astype(np.float32)
    b[:, 2:4] = np.abs(b[:, 2:4]) + 1
    got = probiou(a, b)
    assert got.shape == (20, 20)
    for i in range(20):
        for j in (i, (i + 7) % 20):
            assert got[i, j] == pytest.approx(_reference(a[i], b[j]), abs=2e-4)


def test_the_same_rectangle_turned_a_quarter_overlaps_itself_fully() -> None:
    """(w, h, angle) and (h, w, angle + pi/2) are one rectangle; a tilted copy is not."""
    box = np.array([[10, 20, 30, 6, 0.3]], np.float32)
    turned = np.array([[10, 20, 6, 30, 0.3 + np.pi / 2]], np.float32)
    tilted = np.array([[10, 20, 30, 6, 0.3 + 0.5]], np.float32)
    assert probiou(box, turned)[0, 0] == pytest.approx(1.0, abs=1e-3)
    assert probiou(box, tilted)[0, 0] < 0.8


def test_a_box_dropped_still_suppresses_the_boxes_below_it() -> None:
    """Ultralytics' fast NMS: B overlaps A (dropped), C overlaps B but not A: C is dropped too
    (greedy NMS would keep it)."""
    boxes = np.array([[0, 0, 20, 10, 0], [6, 0, 20, 10, 0], [12, 0, 20, 10, 0]], np.float32)
    overlaps = probiou(boxes, boxes)
    threshold = 0.5
    assert overlaps[0, 1] > threshold and overlaps[1, 2] > threshold and overlaps[0, 2] < threshold
    keep = rotated_nms_indices(boxes, np.array([0.9, 0.8, 0.7], np.float32), threshold)
    assert keep.tolist() == [0]


def test_an_overlap_equal_to_the_threshold_is_kept() -> None:
    boxes = np.array([[0, 0, 20, 10, 0.2], [5, 1, 18, 9, 0.4]], np.float32)
    threshold = float(probiou(boxes[:1], boxes[1:])[0, 0])
    keep = rotated_nms_indices(boxes, np.array([0.9, 0.8], np.float32), threshold)
    assert keep.tolist() == [0, 1]
    assert rotated_nms_indices(boxes, np.array([0.9, 0.8], np.float32), threshold - 1e-4).tolist() == [0]


def test_classes_do_not_suppress_each_other_and_max_det_keeps_the_best() -> None:
    boxes = np.array([[0, 0, 20, 10, 0], [1, 0, 20, 10, 0], [0, 1, 20, 10, 0]], np.float32)
    scores = np.array([0.5, 0.9, 0.7], np.float32)
    keep = rotated_nms_indices(boxes, scores, 0.5, class_id=np.array([0, 0, 1], np.int32))
    assert keep.tolist() == [1, 2]
    assert rotated_nms_indices(boxes, scores, 0.5, max_det=1, class_id=np.array([0, 1, 2], np.int32)).tolist() == [1]


def test_blocks_give_the_answer_of_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    boxes = np.column_stack(
        [
            rng.uniform(0, 100, 300),
            rng.uniform(0, 100, 300),
            rng.uniform(5, 30, 300),
            rng.uniform(5, 30, 300),
            rng.uniform(0, 3, 300),
        ]
    ).astype(np.float32)
    scores = rng.uniform(0, 1, 300).astype(np.float32)
    whole = rotated_nms_indices(boxes, scores, 0.4)
    monkeypatch.setattr(rotated, "BLOCK", 7)
    assert rotated_nms_indices(boxes, scores, 0.4).tolist() == whole.tolist()
    assert 10 < len(whole) < 300


def test_corners_and_their_hull() -> None:
    box = np.array([[10, 20, 8, 4, np.pi / 2]], np.float32)  # turned a quarter: 4 wide, 8 tall
    points = corners(box)[0]
    assert points.shape == (4, 2)
    np.testing.assert_allclose(points.mean(axis=0), [10, 20], atol=1e-5)
    np.testing.assert_allclose(hull_xyxy(box)[0], [8, 16, 12, 24], atol=1e-5)
    # the first corner is centre + w/2 along the angle + h/2 across it (Ultralytics' order)
    np.testing.assert_allclose(points[0], [10 - 2, 20 + 4], atol=1e-5)
