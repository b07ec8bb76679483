"""`pipelines.decoding.detection_filter`: a camera's conf, classes, iou and max_det, applied by
`Detector.postprocess` instead of the model's own; the boundary of conf; classes before max_det."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from testkit.onnx_models import two_overlapping_boxes

from pipelines.decoding.detection_filter import DEFAULTS, DetectionFilter
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import CameraDetector, Detector
from runtimes.registry import load_runtime

GREY = np.full((64, 64, 3), 114, np.uint8)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"conf": 1.5}, "conf must be within 0..1, got 1.5"),
        ({"conf": -0.01}, "conf must be within 0..1, got -0.01"),
        ({"iou": 1.01}, "iou must be within 0..1, got 1.01"),
        ({"max_det": 0}, "max_det must be at least 1, got 0"),
        ({"classes": frozenset({2, -1})}, "class ids must be 0 or more, got [-1, 2]"),
    ],
)
def test_a_filter_refuses_values_no_camera_can_use(settings: dict, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        DetectionFilter(**settings)
    assert str(refused.value) == message


def test_the_edges_of_the_ranges_are_allowed() -> None:
    assert DetectionFilter(conf=0.0, iou=1.0, max_det=1, classes=frozenset({0})).max_det == 1
    assert DetectionFilter(conf=1.0, iou=0.0).conf == 1.0


@pytest.mark.parametrize(
    ("classes", "kept"),
    [(None, [0, 1, 2, 1]), (frozenset({1}), [1, 1]), (frozenset({0, 2}), [0, 2]), (frozenset(), [])],
)
def test_keep_classes(classes: frozenset[int] | None, kept: list[int]) -> None:
    found = Detections(np.zeros((4, 4), np.float32), np.full(4, 0.9, np.float32), np.array([0, 1, 2, 1], np.int32))
    assert DetectionFilter(classes=classes).keep_classes(found).class_id.tolist() == kept


def three_classes(constant_model) -> Path:  # type: ignore[no-untyped-def]
    """A YOLOv8-layout model on a 64x64 input: three boxes apart, class 0 scoring exactly 0.5,
    class 1 scoring 0.6, class 2 scoring 0.9."""
    rows = np.zeros((1, 4 + 3, 16), np.float32)  # more anchors than values per anchor, as real heads
    rows[0, :4, :] = [[10.0], [10.0], [4.0], [4.0]]  # small boxes at (10, 10) scoring 0
    for anchor, (x, class_id, score) in enumerate([(12.0, 0, 0.5), (32.0, 1, 0.6), (52.0, 2, 0.9)]):
        rows[0, :4, anchor] = [x, 32.0, 8.0, 8.0]
        rows[0, 4 + class_id, anchor] = score
    return constant_model(rows, metadata={"names": "{0: 'a', 1: 'b', 2: 'c'}"})  # type: ignore[no-any-return]


def classes_found(detector: Detector, detection_filter: DetectionFilter | None = None) -> list[int]:
    return detector.detect(GREY, detection_filter).class_id.tolist()  # highest score first


def test_the_cameras_conf_is_used_and_a_score_equal_to_it_is_left_out(constant_model) -> None:
    """The model's own conf is 0.95 (as a manifest could say): the camera's wins. 0.5 scores
    exactly the camera's conf and is left out, as the decoders keep 'above conf'."""
    detector = Detector(load_runtime("onnxruntime", three_classes(constant_model)), "yolov8", conf=0.95)
    assert classes_found(detector) == []
    assert classes_found(detector, DetectionFilter(conf=0.3)) == [2, 1, 0]
    assert classes_found(detector, DetectionFilter(conf=0.5)) == [2, 1]
    assert classes_found(detector, DetectionFilter(conf=0.49)) == [2, 1, 0]
    detector.close()


def test_classes_are_kept_before_max_det_so_unwanted_ones_take_no_place(constant_model) -> None:
    """max_det 1 with only class 1 wanted keeps class 1's box (0.6), not nothing: the classes a
    camera does not want are dropped before NMS and max_det."""
    detector = Detector(load_runtime("onnxruntime", three_classes(constant_model)), "yolov8")
    assert classes_found(detector, DetectionFilter(max_det=1)) == [2]
    assert classes_found(detector, DetectionFilter(max_det=1, classes=frozenset({1}))) == [1]
    assert classes_found(detector, DetectionFilter(classes=frozenset({0, 2}))) == [2, 0]
    detector.close()


def test_the_cameras_iou_and_max_det_are_used(constant_model) -> None:
    """Two boxes of one class overlapping at IoU 2/3: the model's own iou (0.45) keeps one, the
    camera's 0.7 both; the camera's max_det 1 one again."""
    detector = Detector(load_runtime("onnxruntime", two_overlapping_boxes(constant_model)), "yolov8")
    assert len(detector.detect(GREY)) == 1
    assert len(detector.detect(GREY, DetectionFilter(iou=0.7))) == 2
    assert len(detector.detect(GREY, DetectionFilter(iou=0.7, max_det=1))) == 1
    detector.close()


def test_a_final_output_keeps_the_cameras_classes_before_max_det(constant_model) -> None:
    """An end-to-end model (NMS in the graph, rows x1 y1 x2 y2 score class): no NMS here, but
    conf, classes and max_det are the camera's."""
    rows = np.zeros((1, 10, 6), np.float32)
    rows[0, :3] = [[4, 4, 20, 20, 0.9, 2], [24, 4, 40, 20, 0.7, 1], [44, 4, 60, 20, 0.5, 1]]
    detector = Detector(load_runtime("onnxruntime", constant_model(rows)), "end2end")
    keep = DetectionFilter(conf=0.5, max_det=1, classes=frozenset({1}))
    assert detector.detect(GREY, keep).confidence.tolist() == pytest.approx([0.7])
    assert classes_found(detector, DetectionFilter(conf=0.4, classes=frozenset({1}))) == [1, 1]
    detector.close()


def test_a_camera_detector_keeps_by_its_own_filter(constant_model) -> None:
    """A camera with a model of its own (share_model: false) sees what its filter keeps."""
    detector = Detector(load_runtime("onnxruntime", three_classes(constant_model)), "yolov8")
    camera = CameraDetector(detector, DetectionFilter(conf=0.55, classes=frozenset({0, 1})))
    tensor, transform = camera.prepare(GREY)
    assert tensor.dtype == np.uint8, "a camera's frame waits as uint8 pixels; infer normalises them"
    assert camera.postprocess(camera.infer(tensor), transform).class_id.tolist() == [1]
    assert camera.runtime is detector.runtime and camera.detection_filter.conf == 0.55
    camera.close()
    assert detector.runtime._session is None, "closing the camera's detector closes its runtime"


def test_a_detectors_own_filter_is_its_construction_thresholds(constant_model) -> None:
    """What a bundle's manifest says (`open_detector` passes it): the defaults where it says nothing."""
    runtime = load_runtime("onnxruntime", three_classes(constant_model))
    detector = Detector(runtime, "yolov8", conf=0.55, max_det=5)
    assert detector.detection_filter == DetectionFilter(conf=0.55, iou=DEFAULTS.iou, max_det=5, classes=None)
    assert (detector.conf, detector.iou, detector.max_det) == (0.55, 0.45, 5)
    assert classes_found(detector) == [2, 1]
    detector.close()
