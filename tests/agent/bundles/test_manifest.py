"""`agent.bundles.manifest`: valid manifests round-trip, invalid ones name the field, the published
schema is current."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError
from testkit import REPO

from agent.bundles.manifest import Manifest, decoder_task, schema_json

GOOD = {
    "schema_version": 1,
    "name": "people-counter",
    "version": "1.4.0-rc.1",
    "created": "2026-11-29T12:00:00+00:00",
    "decoder": "yolov8",
    "input": {"size": [640, 640], "color": "RGB", "resize": "letterbox"},
    "labels": ["person"],
    "artifacts": [{"path": "m.onnx", "format": "onnx", "precision": "fp32", "sha256": "a" * 64, "size": 10}],
}

#: an OpenVINO IR artifact: the .xml, its weights .bin listed in files
IR = {"path": "m.xml", "format": "openvino", "precision": "int8", "sha256": "c" * 64, "size": 10}
MODULE = {
    "path": "m.so",
    "format": "tvm",
    "precision": "fp32",
    "sha256": "e" * 64,
    "size": 30,
    "target": {
        "target": '{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}',
        "arch": "aarch64",
        "runtime_version": "0.27.0",
    },
}


def test_a_valid_manifest_round_trips() -> None:
    manifest = Manifest.model_validate(GOOD)
    assert Manifest.model_validate(json.loads(manifest.to_bytes())) == manifest
    assert manifest.thresholds.conf == 0.25 and manifest.reference.path == "reference.npz"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": "1.4"}, "not a semantic version"),
        ({"schema_version": 2}, "schema_version"),
        ({"name": "../evil"}, "name"),
        ({"extra": 1}, "Extra inputs are not permitted"),
        ({"labels": []}, "labels"),
        ({"labels": ["person", "x" * 129]}, r"labels\[1\] is 129 characters long, more than 128"),
        ({"artifacts": [{**GOOD["artifacts"][0], "path": "../m.onnx"}]}, "plain file name"),
        ({"artifacts": [{**GOOD["artifacts"][0], "sha256": "XYZ"}]}, "sha256"),
        ({"artifacts": [GOOD["artifacts"][0], GOOD["artifacts"][0]]}, "must be unique"),
        ({"files": [{"path": "etc/passwd", "sha256": "b" * 64, "size": 1}]}, "calibration/<name>"),
        (
            {"tensorrt_profile": {"min": [1, 3, 640, 640], "opt": [1, 3, 320, 320], "max": [1, 3, 640, 640]}},
            "min <= opt <= max",
        ),
        ({"thresholds": {"conf": 1.5}}, "conf"),
        ({"task": "pose"}, "task 'pose' does not fit decoder 'yolov8', which reads detect models"),
        ({"task": "segment", "decoder": "yolov8-obb"}, "which reads obb models"),
        ({"task": "classify"}, "task"),
        ({"artifacts": [{**GOOD["artifacts"][0], "format": "tflite"}]}, "'m.onnx' of format tflite must be a .tflite"),
        ({"artifacts": [{**GOOD["artifacts"][0], "format": "openvino"}]}, "of format openvino must be a .xml file"),
        ({"artifacts": [IR]}, r"OpenVINO IR m\.xml: its weights m\.bin must also be listed in files"),
        ({"artifacts": [IR], "files": [{"path": "n.bin", "sha256": "b" * 64, "size": 1}]}, r"its weights m\.bin"),
        (
            {"artifacts": [{**MODULE, "target": None}]},
            "a target is recorded for a tvm, rknn or hef artifact, and only for one",
        ),
        ({"artifacts": [{**GOOD["artifacts"][0], "target": MODULE["target"]}]}, "and only for one"),
        ({"artifacts": [{**MODULE, "path": "m.onnx"}]}, "of format tvm must be a .so file"),
        ({"artifacts": [MODULE]}, r"TVM module m\.so: its record m\.so\.json must also be listed in files"),
        ({"artifacts": [{**MODULE, "target": {**MODULE["target"], "arch": "AArch64!"}}]}, "arch"),
    ],
)
def test_invalid_manifests_name_the_field(change: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Manifest.model_validate({**GOOD, **change})


def test_a_label_of_the_longest_length_is_valid() -> None:
    assert Manifest.model_validate({**GOOD, "labels": ["x" * 128]}).labels == ["x" * 128]


def test_a_tvm_module_with_its_target_and_record_is_valid() -> None:
    record = {"path": "m.so.json", "sha256": "d" * 64, "size": 20}
    manifest = Manifest.model_validate({**GOOD, "artifacts": [GOOD["artifacts"][0], MODULE], "files": [record]})
    assert [a.companion for a in manifest.artifacts] == [None, "m.so.json"]
    assert manifest.artifacts[1].target is not None and manifest.artifacts[1].target.arch == "aarch64"
    data = json.loads(manifest.to_bytes())
    assert "target" not in data["artifacts"][0], "no key on an artifact that is not compiled (older agents)"
    assert Manifest.model_validate(data) == manifest


def test_a_hef_beside_its_onnx_model_carries_its_chip_and_its_record() -> None:
    # fails on: the format hef refused (a HAT+ bundle cannot ship its HEF), a HEF without its chip
    # accepted (TARGET_MISMATCH could not be told before activation), or a CPU arch demanded of it
    hef = {"path": "m.hef", "format": "hef", "precision": "int8", "sha256": "f" * 64, "size": 40}
    chip = {"target": "hailo8l", "runtime_version": "3.31.0"}
    record = {"path": "m.hef.json", "sha256": "d" * 64, "size": 20}
    manifest = Manifest.model_validate(
        {**GOOD, "artifacts": [GOOD["artifacts"][0], {**hef, "target": chip}], "files": [record]}
    )
    (_, shipped) = manifest.artifacts
    assert shipped.format == "hef" and shipped.companion == "m.hef.json"
    assert shipped.target is not None and (shipped.target.target, shipped.target.arch) == ("hailo8l", None)
    assert Manifest.model_validate(json.loads(manifest.to_bytes())) == manifest
    with pytest.raises(ValidationError, match="a target is recorded for a tvm, rknn or hef artifact, and only for one"):
        Manifest.model_validate({**GOOD, "artifacts": [hef], "files": [record]})
    with pytest.raises(ValidationError, match=r"HEF m\.hef: its record m\.hef\.json must also be listed in files"):
        Manifest.model_validate({**GOOD, "artifacts": [{**hef, "target": chip}]})
    with pytest.raises(ValidationError, match="names a CPU architecture unless a HEF's"):
        Manifest.model_validate({**GOOD, "artifacts": [{**hef, "target": MODULE["target"]}], "files": [record]})
    with pytest.raises(ValidationError, match="names a CPU architecture unless a HEF's"):
        Manifest.model_validate({**GOOD, "artifacts": [{**MODULE, "target": chip}]})
    with pytest.raises(ValidationError, match=r"artifact 'm\.onnx' of format hef must be a \.hef file"):
        Manifest.model_validate({**GOOD, "artifacts": [{**hef, "path": "m.onnx", "target": chip}]})


def test_an_openvino_ir_with_its_weights_listed_is_valid() -> None:
    weights = {"path": "m.bin", "sha256": "d" * 64, "size": 20}
    manifest = Manifest.model_validate({**GOOD, "artifacts": [GOOD["artifacts"][0], IR], "files": [weights]})
    assert [a.weights for a in manifest.artifacts] == [None, "m.bin"]
    assert Manifest.model_validate(json.loads(manifest.to_bytes())) == manifest


@pytest.mark.schema_docs
def test_exported_schema_is_current() -> None:
    """docs/manifest.schema.json is regenerated with `python -m agent.bundles.manifest`."""
    assert (REPO / "docs" / "manifest.schema.json").read_text() == schema_json()


STAGE = {
    "artifacts": [{"path": "c.onnx", "format": "onnx", "precision": "fp32", "sha256": "c" * 64, "size": 5}],
    "labels": ["helmet", "no helmet"],
    "for": ["person"],
    "every_s": 2.5,
}


def test_an_older_manifest_without_a_second_stage_stays_valid_and_writes_no_classifier_key() -> None:
    manifest = Manifest.model_validate(GOOD)
    assert manifest.classifier is None
    assert "classifier" not in json.loads(manifest.to_bytes()), "agents older than the field refuse unknown keys"


def test_a_second_stage_round_trips_with_its_for_key() -> None:
    manifest = Manifest.model_validate({**GOOD, "classifier": STAGE})
    stage = manifest.classifier
    assert stage is not None and stage.for_labels == ["person"] and stage.every_s == 2.5
    written = json.loads(manifest.to_bytes())["classifier"]
    assert written["for"] == ["person"] and "for_labels" not in written
    assert Manifest.model_validate(json.loads(manifest.to_bytes())) == manifest
    defaults = Manifest.model_validate({**GOOD, "classifier": {k: STAGE[k] for k in ("artifacts", "labels")}})
    assert (
        defaults.classifier is not None and defaults.classifier.for_labels == [] and defaults.classifier.every_s == 5.0
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"for": ["dog"]}, "classifier.for names dog, which the detector's labels"),
        ({"labels": []}, "labels"),
        ({"labels": ["helmet", " "]}, "classifier labels must not be empty"),
        ({"labels": ["helmet", "y" * 200]}, r"classifier\.labels\[1\] is 200 characters long"),
        ({"every_s": 0}, "every_s"),
        ({"artifacts": []}, "artifacts"),
        ({"artifacts": [{**STAGE["artifacts"][0], "path": "m.onnx"}]}, "must be unique"),  # the detector's file
        ({"model": "c.onnx"}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_second_stages_name_the_field(change: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Manifest.model_validate({**GOOD, "classifier": {**STAGE, **change}})


@pytest.mark.parametrize(
    ("task", "decoder"),
    [("segment", "yolov8-seg"), ("pose", "end2end-pose"), ("obb", "yolov8-obb"), ("detect", "yolov8")],
)
def test_a_task_fits_its_decoder(task: str, decoder: str) -> None:
    assert Manifest.model_validate({**GOOD, "task": task, "decoder": decoder}).task == task == decoder_task(decoder)


def test_older_bundles_say_detect_over_any_decoder() -> None:
    """Before tasks every manifest said (or defaulted to) detect, also over a task decoder."""
    assert Manifest.model_validate({**GOOD, "decoder": "yolov8-seg"}).task == "detect"
    assert Manifest.model_validate({**GOOD, "task": "detect", "decoder": "end2end-obb"}).task == "detect"
