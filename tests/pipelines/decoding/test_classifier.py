"""`pipelines.decoding.classifier` on the shipped crop classifier (agent/demo/demo_classify*)
through the real ONNX Runtime and LiteRT, and its preprocessing (shortest side, centre crop)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS

from pipelines.decoding.classifier import Classification, Classifier, crop_tensor
from pipelines.decoding.decoders import DecoderError
from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene
from runtimes.registry import load_runtime


@pytest.fixture(scope="module")
def crops() -> list[tuple[np.ndarray, int]]:
    """Crops of single, mostly visible shapes from scenes far from the training seeds."""
    out = []
    for seed in range(320_000, 320_006):
        image, truth = SyntheticScene(num_shapes=5, seed=seed).render(2)
        for box, cls, shown in zip(truth.detections.xyxy, truth.detections.class_id, truth.visible, strict=True):
            if shown > 0.9:
                x1, y1, x2, y2 = (int(v) for v in box)
                out.append((image[max(y1 - 5, 0) : y2 + 5, max(x1 - 5, 0) : x2 + 5], int(cls)))
    return out


def _classifier(name: str) -> Iterator[Classifier]:
    path = DEMO_MODELS / name
    with load_runtime("onnxruntime" if path.suffix == ".onnx" else "litert", Path(path)) as runtime:
        yield Classifier(runtime)


def _scores(name: str, crops: list[tuple[np.ndarray, int]]) -> np.ndarray:
    for classifier in _classifier(name):
        assert classifier.num_classes == len(CLASS_NAMES) and classifier.input_hw == (64, 64)
        return np.stack([classifier.classify(crop).scores for crop, _ in crops])
    raise AssertionError("unreachable")


@pytest.mark.parametrize("name", ["demo_classify.onnx", "demo_classify_fp32.tflite", "demo_classify_int8.tflite"])
def test_the_classifier_names_the_shapes(crops: list[tuple[np.ndarray, int]], name: str) -> None:
    scores = _scores(name, crops)
    truth = np.array([cls for _, cls in crops])
    assert len(crops) >= 12
    assert (scores.argmax(axis=1) == truth).mean() >= 0.9
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=0.02)


def test_every_form_gives_the_onnx_scores(crops: list[tuple[np.ndarray, int]]) -> None:
    onnx = _scores("demo_classify.onnx", crops)
    np.testing.assert_allclose(_scores("demo_classify_fp32.tflite", crops), onnx, atol=1e-3)
    np.testing.assert_allclose(_scores("demo_classify_int8.tflite", crops), onnx, atol=0.08)


def test_top_k_is_highest_first() -> None:
    result = Classification(np.array([0.1, 0.6, 0.1, 0.2], np.float32))
    assert result.top(3) == [(1, pytest.approx(0.6)), (3, pytest.approx(0.2)), (0, pytest.approx(0.1))]
    assert len(result.top(10)) == 4 and result.top(0) == []


def test_shortest_side_then_centre_crop() -> None:
    """A 40x80 (h x w) image: resized to 64x128, the middle 64 columns kept; RGB /255."""
    image = np.zeros((40, 80, 3), np.uint8)
    image[:, :20] = (255, 0, 0)  # blue left quarter: cropped away
    image[:, 20:60] = (0, 0, 200)  # red middle
    tensor = crop_tensor(image, (64, 64), "NCHW")
    assert tensor.shape == (1, 3, 64, 64) and tensor.dtype == np.float32
    # the middle (away from the blended edges) is red, channel 0; no blue is left
    assert tensor[0, 0, :, 4:60].min() == pytest.approx(200 / 255, abs=0.02)
    assert tensor[0, 2, :, 4:].max() == 0.0 and tensor[0, 2, :, 0].max() < 0.5
    assert crop_tensor(image, (64, 64), "NHWC").shape == (1, 64, 64, 3)


def test_a_detector_is_not_a_classifier() -> None:
    expected = r"one output of class scores \(1, nc\), the model has \(1, 7, 2100\)"
    with (
        load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx") as runtime,
        pytest.raises(DecoderError, match=expected),
    ):
        Classifier(runtime)
