"""The candidate-against-serving comparison (`pipelines.measure.comparison`) on hand-made detections."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from testkit import DEMO_MODELS

from pipelines.decoding.detection_filter import DetectionFilter
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.measure.comparison import Agreement, compare_frame
from pipelines.sources.synthetic import SyntheticScene
from runtimes.registry import load_runtime


def boxes(rows: Sequence[Sequence[float]], **extra: object) -> Detections:
    """Detections from rows of (x1, y1, x2, y2, confidence, class id)."""
    array = np.array(rows, np.float32).reshape(-1, 6)
    return Detections(array[:, :4], array[:, 4], array[:, 5].astype(np.int32), **extra)  # type: ignore[arg-type]


SCENE = [(0, 0, 10, 10, 0.9, 0), (20, 20, 40, 40, 0.8, 0), (50, 50, 60, 70, 0.7, 1)]


def test_the_same_detections_agree_fully() -> None:
    agreement = Agreement()
    agreement.add(boxes(SCENE), boxes(SCENE))
    report = agreement.report()
    assert (report.frames, report.serving, report.candidate, report.matched) == (1, 3, 3, 3)
    assert report.precision == report.recall == report.agreement == 1.0
    assert report.confident_ratio == 1.0


def test_swapped_classes_match_nothing_and_show_per_class() -> None:
    swapped = [(*row[:5], 1 - row[5]) for row in SCENE]
    agreement = Agreement()
    agreement.add(boxes(SCENE), boxes(swapped))
    report = agreement.report()
    assert report.matched == 0 and report.agreement == 0.0
    person, car = report.of_class(0), report.of_class(1)
    assert person is not None and car is not None
    assert (person.serving, person.candidate, person.matched) == (2, 1, 0)
    assert (car.serving, car.candidate, car.matched) == (1, 2, 0)


@pytest.mark.parametrize(("shift", "matched"), [(0.0, 1), (10 / 3, 1), (3.4, 0), (5.0, 0)])
def test_a_box_matches_from_an_iou_of_one_half(shift: float, matched: int) -> None:
    # a 10 x 10 box moved right by s overlaps (10 - s) * 10 of a union (10 + s) * 10: IoU 0.5 at s = 10/3
    agreement = Agreement()
    agreement.add(boxes([(0, 0, 10, 10, 0.9, 0)]), boxes([(shift, 0, 10 + shift, 10, 0.9, 0)]))
    assert agreement.report().matched == matched


def test_precision_and_recall_are_the_candidates_against_the_serving_model() -> None:
    agreement = Agreement()
    extra = (80, 80, 90, 90, 0.9, 0)
    agreement.add(boxes(SCENE), boxes([SCENE[0], extra]))  # one of three found, one of two right
    report = agreement.report()
    assert report.recall == pytest.approx(1 / 3) and report.precision == pytest.approx(1 / 2)
    assert report.agreement == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))


def test_scores_that_collapsed_show_in_the_confident_ratio() -> None:
    agreement = Agreement()
    agreement.add(boxes(SCENE), boxes([(*row[:4], row[4] * 0.2, row[5]) for row in SCENE]))
    assert agreement.report().confident_ratio == 0.0
    at_the_line = Agreement()
    at_the_line.add(boxes([(0, 0, 10, 10, 0.5, 0)]), boxes([(0, 0, 10, 10, 0.5, 0)]))
    assert at_the_line.report().confident_ratio == 1.0, "0.5 itself is confident"


def test_frames_where_neither_found_anything_agree() -> None:
    agreement = Agreement()
    agreement.add(boxes([]), boxes([]))
    report = agreement.report()
    assert report.frames == 1 and report.agreement == 1.0 and report.confident_ratio is None


def test_latency_is_the_median_of_what_was_timed() -> None:
    agreement = Agreement()
    for ms in (10.0, 30.0, 20.0):
        agreement.add(boxes(SCENE), boxes(SCENE), serving_ms=ms, candidate_ms=ms * 2)
    report = agreement.report()
    assert (report.serving_ms, report.candidate_ms) == (20.0, 40.0)


def test_keypoints_count_within_a_tenth_of_the_box_diagonal() -> None:
    serving = np.array([[[2, 2, 0.9], [8, 8, 0.9], [5, 5, 0.1]]], np.float32)  # the third not visible
    candidate = serving.copy()
    candidate[0, 1, :2] += 1.5  # 2.1 px off, the diagonal is 14.1 px: outside 1.41
    candidate[0, 2, :2] += 9  # not visible in the serving model's: left out
    agreement = Agreement()
    row = [(0, 0, 10, 10, 0.9, 0)]
    agreement.add(boxes(row, keypoints=serving), boxes(row, keypoints=candidate))
    report = agreement.report()
    assert report.task == "keypoints" and report.task_score == 0.5


def test_oriented_boxes_compare_by_their_rotated_overlap() -> None:
    row = [(0, 0, 20, 20, 0.9, 0)]
    same = np.array([[10, 10, 20, 10, 0.0]], np.float32)
    turned = np.array([[10, 10, 20, 10, np.pi / 2]], np.float32)
    agreement = Agreement()
    agreement.add(boxes(row, xywhr=same), boxes(row, xywhr=same))
    agreement.add(boxes(row, xywhr=same), boxes(row, xywhr=turned))
    report = agreement.report()
    assert report.task == "oriented" and report.task_score is not None and 0.5 < report.task_score < 0.9


def test_compare_frame_runs_both_models_and_times_each_with_its_clock() -> None:
    """The shadow's and bench --against's one step, on real ONNX Runtime and LiteRT detectors: the
    serving model is timed first, then the candidate, each from the clock it is given."""
    image = SyntheticScene(width=320, height=240, seed=3).render(0)[0]
    ticks = iter([10.0, 10.004, 10.010, 20.0, 20.005, 20.007])
    with (
        load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx") as fp32,
        load_runtime("litert", DEMO_MODELS / "demo_detector_int8.tflite") as int8,
    ):
        serving, candidate = Detector(fp32), Detector(int8)
        agreement = Agreement()
        expected, found = compare_frame(agreement, image, serving, candidate, clock=lambda: next(ticks))
        assert len(expected) > 0 and np.array_equal(expected.xyxy, serving.detect(image).xyxy)
        assert np.array_equal(found.xyxy, candidate.detect(image).xyxy), "the candidate's own detections"
        squares = DetectionFilter(conf=0.25, classes=frozenset({1}))
        kept = compare_frame(agreement, image, serving, candidate, squares, clock=lambda: next(ticks))
        assert all(set(d.class_id.tolist()) <= {1} for d in kept), "the camera's filter, on both"
    report = agreement.report()
    assert report.frames == 2 and report.serving == len(expected) + len(kept[0])
    assert report.candidate == len(found) + len(kept[1])
    assert report.serving_ms == pytest.approx(4.5) and report.candidate_ms == pytest.approx(4.0)
