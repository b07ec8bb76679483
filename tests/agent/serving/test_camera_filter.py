"""`agent.serving.camera_filter`: a camera's agent.yaml settings over the manifest's, class names as
the version's ids, a name the version lacks as a located problem, what the snapshot shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.bundles.manifest import Manifest
from agent.config.loading import ConfigLines, load_config
from agent.config.models import CameraSection
from agent.serving.camera_filter import camera_filter, class_problems, in_force
from agent.snapshot import ThresholdsInForce
from pipelines.decoding.detection_filter import DetectionFilter

MANIFEST = Manifest.model_validate(
    {
        "schema_version": 1,
        "name": "yard",
        "version": "2.0.0",
        "created": "2026-11-29T12:00:00+00:00",
        "decoder": "yolov8",
        "input": {"size": [640, 640], "color": "RGB", "resize": "letterbox"},
        "labels": ["person", "bicycle", "car", "truck"],
        "thresholds": {"conf": 0.4, "iou": 0.6, "max_det": 50},
        "artifacts": [{"path": "m.onnx", "format": "onnx", "precision": "fp32", "sha256": "a" * 64, "size": 10}],
    }
)


def section(**settings: object) -> CameraSection:
    return CameraSection.model_validate({"name": "gate", "source": "synthetic", **settings})


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, DetectionFilter(conf=0.4, iou=0.6, max_det=50)),
        ({"conf": 0.7}, DetectionFilter(conf=0.7, iou=0.6, max_det=50)),
        ({"conf": 0.0, "iou": 0.3, "max_det": 5}, DetectionFilter(conf=0.0, iou=0.3, max_det=5)),
        ({"classes": ["car", "person"]}, DetectionFilter(conf=0.4, iou=0.6, max_det=50, classes=frozenset({0, 2}))),
    ],
)
def test_the_camera_overrides_what_it_sets_and_the_manifest_gives_the_rest(
    settings: dict, expected: DetectionFilter
) -> None:
    """conf 0.0 is a setting, not 'unset' (a falsy value must not fall back to the manifest's)."""
    resolved = camera_filter(0, section(**settings), MANIFEST)
    assert resolved.detection_filter == expected and resolved.problems == ()


def test_a_class_the_version_lacks_is_a_problem_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "cameras:\n"
        "  - name: lobby\n"
        "    source: synthetic\n"
        "  - name: gate\n"
        "    source: synthetic\n"
        "    classes:\n"
        "      - car\n"
        "      - persn\n"
    )
    config = load_config(path)
    resolved = camera_filter(1, config.cameras[1], MANIFEST, ConfigLines.read(path).where)
    assert resolved.detection_filter.classes == frozenset({2}), "the names it has are kept"
    assert resolved.problems == (
        f"{path}:8: cameras.1.classes.1: 'persn' is not a label of yard 2.0.0 (its labels: person, bicycle, "
        "car, truck), so camera gate keeps no detections of it",
    )
    assert class_problems(0, config.cameras[0], MANIFEST) == []


def test_only_unknown_classes_keep_nothing() -> None:
    resolved = camera_filter(0, section(classes=["bus"]), MANIFEST)
    assert resolved.detection_filter.classes == frozenset() and len(resolved.problems) == 1
    assert resolved.problems[0].startswith("cameras.0.classes.0: 'bus' is not a label of yard 2.0.0")


def test_what_the_snapshot_shows() -> None:
    """Class ids back as the version's names; which keys agent.yaml set."""
    serving = DetectionFilter(conf=0.7, iou=0.6, max_det=50, classes=frozenset({3, 0}))
    shown = in_force(section(conf=0.7, classes=["truck", "person"]), serving, MANIFEST.labels, ["a problem"])
    assert shown == ThresholdsInForce("gate", 0.7, 0.6, 50, ("person", "truck"), ("conf", "classes"), ("a problem",))
    everything = in_force(section(), DetectionFilter(conf=0.4, iou=0.6, max_det=50), MANIFEST.labels)
    assert everything == ThresholdsInForce("gate", 0.4, 0.6, 50, None, (), ())
    assert in_force(section(max_det=1), DetectionFilter(max_det=1), []).configured == ("max_det",)
