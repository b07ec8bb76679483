"""Both second stages on the same crops (`pipelines.measure.second_stage`): the demo shape
classifier (real ONNX Runtime) on the synthetic scene's shapes, cut by their true boxes."""

from __future__ import annotations

import numpy as np
import pytest
from testkit import DEMO_MODELS

from pipelines.decoding.classifier import Classifier
from pipelines.decoding.detections import Detections
from pipelines.measure.comparison import Agreement
from pipelines.measure.second_stage import SecondStages, top1_same
from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene
from runtimes.registry import load_runtime

ROTATED = CLASS_NAMES[1:] + CLASS_NAMES[:1]  # circle read as square, square as triangle, ...


@pytest.fixture(scope="module")
def classifier() -> Classifier:
    return Classifier(load_runtime("onnxruntime", DEMO_MODELS / "demo_classify.onnx"))


def frame() -> tuple[np.ndarray, Detections]:
    image, truth = SyntheticScene(num_shapes=8, seed=1).render(0)  # circle, square, triangle, circle, square, ...
    d = truth.detections
    confidence = np.linspace(0.9, 0.5, len(d.class_id)).astype(np.float32)  # the first most confident
    return image, Detections(d.xyxy, confidence, d.class_id)


def stages(classifier: Classifier, candidate_labels: tuple[str, ...], for_labels: tuple[str, ...] = ()) -> SecondStages:
    return SecondStages.of((classifier, CLASS_NAMES, for_labels), (classifier, candidate_labels, ()), CLASS_NAMES)


def test_the_same_classifier_names_every_crop_alike_and_slipped_labels_none(classifier: Classifier) -> None:
    image, detections = frame()
    assert top1_same(image, detections, stages(classifier, CLASS_NAMES)) == [True] * 4  # MAX_CROPS
    assert top1_same(image, detections, stages(classifier, ROTATED)) == [False] * 4
    agreement = Agreement()
    agreement.add_crops([True, False, True])
    agreement.add_crops([])
    report = agreement.report()
    assert (report.crops, report.crops_agreeing, report.top1) == (3, 2, pytest.approx(2 / 3))
    assert Agreement().report().top1 is None


def test_only_the_classes_both_stages_are_for_are_cut_most_confident_first(classifier: Classifier) -> None:
    image, detections = frame()
    squares = stages(classifier, CLASS_NAMES, for_labels=("square",))
    assert squares.classes == frozenset({CLASS_NAMES.index("square")})
    cut: list[int] = []

    class Spy(Classifier):
        def __init__(self) -> None:
            self.__dict__.update(classifier.__dict__)

        def classify(self, image: np.ndarray):  # type: ignore[no-untyped-def]
            cut.append(image.shape[0] * image.shape[1])
            return super().classify(image)

    spied = SecondStages(Spy(), CLASS_NAMES, classifier, CLASS_NAMES, squares.classes, max_crops=2)
    same = top1_same(image, detections, spied)
    want = [i for i in range(len(detections.class_id)) if detections.class_id[i] == CLASS_NAMES.index("square")][:2]
    assert len(same) == len(want) == 2
    sizes = [int((x2 - x1 + 1) * (y2 - y1 + 1)) for x1, y1, x2, y2 in detections.xyxy[want].astype(int)]
    assert len(cut) == 2 and all(abs(a - b) <= max(a, b) * 0.1 for a, b in zip(cut, sizes, strict=True))
    outside = Detections(
        np.array([[-50, -50, -10, -10]], np.float32), np.array([0.9], np.float32), np.array([1], np.int32)
    )
    assert top1_same(image, outside, squares) == [], "a box outside the image: no crop"
