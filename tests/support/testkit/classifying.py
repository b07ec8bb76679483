"""The second stage as the tests serve it: the shipped demo classifier (agent/demo/demo_classify*)
on a real runtime, in a `ClassifyingStage` with a clock the test moves."""

from __future__ import annotations

from pathlib import Path

from agent.bundles.manifest import ClassifierStage
from agent.serving.classifying import ClassifyingStage
from agent.serving.loader import LoadedClassifier
from pipelines.decoding.classifier import Classifier
from pipelines.sources.synthetic import CLASS_NAMES
from runtimes.registry import load_runtime
from runtimes.selection import Artifact, Choice
from testkit import DEMO_MODELS


class Clock:
    """A monotonic clock the test moves (seconds)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def demo_classifier(
    name: str = "demo_classify.onnx", every_s: float = 5.0, for_labels: tuple[str, ...] = ()
) -> LoadedClassifier:
    """The demo classifier `name` loaded as a version's second stage would be (ONNX Runtime for
    ``.onnx``, LiteRT for ``.tflite``), for every label or `for_labels`."""
    path = DEMO_MODELS / name
    runtime_name = "onnxruntime" if path.suffix == ".onnx" else "litert"
    fmt = "onnx" if path.suffix == ".onnx" else "tflite"
    entry = {"path": name, "format": fmt, "precision": "fp32", "sha256": "0" * 64, "size": 1}
    stage = ClassifierStage.model_validate(
        {"artifacts": [entry], "labels": list(CLASS_NAMES), "for": list(for_labels), "every_s": every_s}
    )
    choice = Choice(runtime_name, Artifact(str(path), fmt), "cpu", "the tests' demo classifier")
    return LoadedClassifier(Classifier(load_runtime(runtime_name, Path(path))), stage, choice)


def demo_stage(capacity: int = 64, every_s: float = 5.0) -> tuple[ClassifyingStage, Clock]:
    """A stage serving the ONNX demo classifier, not started (the test calls `step`), and its clock."""
    clock = Clock()
    stage = ClassifyingStage(capacity=capacity, clock=clock)
    stage.serve(demo_classifier(every_s=every_s))
    return stage, clock
