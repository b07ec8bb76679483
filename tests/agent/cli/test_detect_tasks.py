"""`edge-agent detect --json` on the shipped task models: masks' polygons, keypoints, oriented
boxes with corners and a classifier's top classes, in the original image's pixels and as
docs/detect-output.schema.json says; exports of a task nobody decodes refused by name."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import pytest
from testkit import DEMO_MODELS
from testkit.detect_output import check_detect_output

from agent.cli import main
from pipelines.sources.frames import GroundTruth
from pipelines.sources.synthetic import SyntheticScene


@pytest.fixture(scope="module")
def frame(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GroundTruth]:
    """A 640x480 frame: the 320x320 input pads 40 rows above it."""
    image, truth = SyntheticScene(640, 480, num_shapes=5, seed=330_001).render(4, masks=True)
    path = tmp_path_factory.mktemp("frames") / "frame.png"
    cv2.imwrite(str(path), image)
    return path, truth


def _detect(capsys: pytest.CaptureFixture[str], model: str, image: Path, *more: str) -> dict[str, Any]:
    assert main(["detect", str(DEMO_MODELS / model), str(image), "--json", *more]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    record: dict[str, Any] = json.loads(line)
    check_detect_output(record)
    return record


def _nearest(box: list[float], truth: GroundTruth, cls: int | None = None) -> int:
    centres = (truth.detections.xyxy[:, :2] + truth.detections.xyxy[:, 2:]) / 2
    distance = np.linalg.norm(centres - [(box[0] + box[2]) / 2, (box[1] + box[3]) / 2], axis=1)
    if cls is not None:
        distance = np.where(truth.detections.class_id == cls, distance, np.inf)
    return int(distance.argmin())


def test_segment_rows_carry_polygons_on_the_shapes(
    capsys: pytest.CaptureFixture[str], frame: tuple[Path, GroundTruth]
) -> None:
    image, truth = frame
    record = _detect(capsys, "demo_segment.onnx", image)
    assert record["decoder"] == "yolov8-seg" and record["detections"]
    for row in record["detections"]:
        polygons = row["mask"]["polygons"]
        assert polygons and sum(len(p) for p in polygons) <= 200
        shown = truth.masks[_nearest(row["box"], truth)]  # type: ignore[index]
        inside = [shown[min(int(y), 479), min(int(x), 639)] for x, y in polygons[0]]
        # the outline lies on the shape's edge: most of its points on or next to the shape's pixels
        near = cv2.dilate(shown.astype(np.uint8), np.ones((7, 7), np.uint8)) > 0
        assert np.mean([near[min(int(y), 479), min(int(x), 639)] for x, y in polygons[0]]) > 0.8, inside


def test_pose_rows_carry_keypoints_in_frame_pixels(
    capsys: pytest.CaptureFixture[str], frame: tuple[Path, GroundTruth]
) -> None:
    image, truth = frame
    record = _detect(capsys, "demo_pose_fp32.tflite", image)
    assert record["decoder"] == "yolov8-pose"
    assert all(row["label"] == "triangle" and len(row["keypoints"]) == 3 for row in record["detections"])
    confident = [row for row in record["detections"] if row["score"] > 0.8]  # the small model errs below
    assert len(confident) >= 2
    for row in confident:
        vertices = truth.keypoints[_nearest(row["box"], truth, cls=2), :, :2]  # type: ignore[index]
        found = np.array(row["keypoints"])[:, :2]
        error = min(np.linalg.norm(np.roll(found, k, axis=0) - vertices, axis=1).max() for k in range(3))
        assert error < 30  # 40 padding rows left in would put them 80 pixels off, 0..1 values hundreds


def test_obb_rows_carry_corners_in_frame_pixels(
    capsys: pytest.CaptureFixture[str], frame: tuple[Path, GroundTruth]
) -> None:
    image, truth = frame
    record = _detect(capsys, "demo_obb_e2e.onnx", image)
    assert record["decoder"] == "end2end-obb" and record["detections"]
    for row in record["detections"]:
        obb = row["obb"]
        corners = np.array(obb["corners"])
        np.testing.assert_allclose(corners.mean(axis=0), [obb["cx"], obb["cy"]], atol=0.2)
        x1, _, _, y2 = row["box"]
        assert corners[:, 0].min() == pytest.approx(max(x1, 0), abs=0.2) and corners[:, 1].max() == pytest.approx(
            min(y2, 480), abs=0.2
        )
        # a triangle's box centre is off its centroid by a quarter of its radius (one of three)
        assert np.linalg.norm(truth.obb[:, :2] - [obb["cx"], obb["cy"]], axis=1).min() < 30  # type: ignore[index]


def test_a_classifier_prints_its_top_classes(
    capsys: pytest.CaptureFixture[str], frame: tuple[Path, GroundTruth], tmp_path: Path
) -> None:
    _, truth = frame
    image = cv2.imread(str(frame[0]))
    best = int(np.argmax(truth.visible * (truth.detections.xyxy[:, 2] - truth.detections.xyxy[:, 0])))
    x1, y1, x2, y2 = (int(v) for v in truth.detections.xyxy[best])
    crop = tmp_path / "crop.png"
    cv2.imwrite(str(crop), image[max(y1 - 5, 0) : y2 + 5, max(x1 - 5, 0) : x2 + 5])
    record = _detect(capsys, "demo_classify.onnx", crop)
    assert record["task"] == "classify" and "detections" not in record
    classes = record["classes"]
    assert classes[0]["label"] == ("circle", "square", "triangle")[truth.detections.class_id[best]]
    assert sorted(c["label"] for c in classes) == ["circle", "square", "triangle"]
    assert [c["score"] for c in classes] == sorted((c["score"] for c in classes), reverse=True)
    assert sum(c["score"] for c in classes) == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize(
    ("task", "error"),
    [
        ("semantic", "names task 'semantic', semantic segmentation"),
        ("depth", "names task 'depth', depth estimation"),
        (None, r"\(1, 8, 2100\) has 1 more row\(s\) than 4 box values and the 3 classes its metadata names"),
    ],
)
def test_an_export_of_a_task_nobody_decodes_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], frame: tuple[Path, GroundTruth], task: str | None, error: str
) -> None:
    """Never printed as boxes: an obb export whose metadata names another task, or none."""
    model = onnx.load(str(DEMO_MODELS / "demo_obb.onnx"))
    props = [p for p in model.metadata_props if p.key != "task"]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    if task is not None:
        model.metadata_props.add(key="task", value=task)
    path = tmp_path / "relabelled.onnx"
    onnx.save(model, str(path))
    assert main(["detect", str(path), str(frame[0]), "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert re.search(error, captured.err), captured.err
