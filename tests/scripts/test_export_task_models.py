"""The shipped task models (agent/demo/demo_{segment,pose,obb,classify}*): small, with
Ultralytics' metadata, each read by the decoder its form needs (scripts/export_task_models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import DEMO_MODELS

from pipelines.decoding.classifier import Classifier
from pipelines.decoding.detector import Detector
from runtimes.registry import load_runtime

#: file -> (task, decoder, class names)
SHIPPED = {
    "demo_segment.onnx": ("segment", "yolov8-seg"),
    "demo_segment_e2e.onnx": ("segment", "end2end-seg"),
    "demo_segment_fp32.tflite": ("segment", "yolov8-seg"),
    "demo_segment_e2e_fp32.tflite": ("segment", "end2end-seg"),
    "demo_segment_int8.tflite": ("segment", "yolov8-seg"),
    "demo_pose.onnx": ("pose", "yolov8-pose"),
    "demo_pose_e2e.onnx": ("pose", "end2end-pose"),
    "demo_pose_fp32.tflite": ("pose", "yolov8-pose"),
    "demo_pose_e2e_fp32.tflite": ("pose", "end2end-pose"),
    "demo_pose_int8.tflite": ("pose", "yolov8-pose"),
    "demo_obb.onnx": ("obb", "yolov8-obb"),
    "demo_obb_e2e.onnx": ("obb", "end2end-obb"),
    "demo_obb_fp32.tflite": ("obb", "yolov8-obb"),
    "demo_obb_e2e_fp32.tflite": ("obb", "end2end-obb"),
    "demo_obb_int8.tflite": ("obb", "yolov8-obb"),
    "demo_classify.onnx": ("classify", None),
    "demo_classify_fp32.tflite": ("classify", None),
    "demo_classify_int8.tflite": ("classify", None),
}


@pytest.mark.parametrize(("name", "expected"), SHIPPED.items())
def test_each_shipped_task_model(name: str, expected: tuple[str, str | None]) -> None:
    task, decoder = expected
    path = DEMO_MODELS / name
    assert path.stat().st_size < 1_200_000  # a demo artifact, not a real model
    with load_runtime("onnxruntime" if path.suffix == ".onnx" else "litert", Path(path)) as runtime:
        meta = runtime.metadata
        assert meta.task == task and meta.imgsz == ((64, 64) if task == "classify" else (320, 320))
        assert meta.end2end == ("_e2e" in name)
        assert meta.kpt_shape == ((3, 3) if task == "pose" else None)
        assert meta.names == ({0: "triangle"} if task == "pose" else {0: "circle", 1: "square", 2: "triangle"})
        assert "Apache-2.0" in meta.raw.get("license", "")
        if decoder is None:
            assert Classifier(runtime).num_classes == 3
        else:
            assert Detector(runtime).decoder == decoder


def test_the_scripts_that_made_them_are_in_the_repo() -> None:
    scripts = DEMO_MODELS.parent.parent / "scripts"
    for name in ("task_models.py", "train_task_models.py", "export_task_models.py", "check_ultralytics_tasks.py"):
        text = (scripts / name).read_text()
        assert "ultralytics import" not in text.split("ULTRALYTICS_SIDE")[0]  # Ultralytics only in its own env
