"""`edge-agent bundle build --classifier ...`: a two-stage bundle built, inspected, activated (both
models checked) and served, its lighter classifier for the governor; bad input refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.optimise import _build

from agent.bundles.archive import Limits, unpack, verify_unpacked
from agent.bundles.installer import activate
from agent.errors import BundleError, ErrorCode
from agent.hardware.board import probe
from agent.serving.loader import open_classifier

DETECTOR = DEMO_MODELS / "demo_detector.onnx"
CLASSIFIER = DEMO_MODELS / "demo_classify.onnx"
CLASSIFIER_INT8 = DEMO_MODELS / "demo_classify_int8.tflite"


@pytest.fixture
def two_stage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The demo detector with the demo classifier (ONNX FP32 and LiteRT INT8) for squares and
    triangles every 2 s, unpacked."""
    out = tmp_path / "two.bundle"
    argv = ["--model", DETECTOR, "--classifier", CLASSIFIER, "--classifier", CLASSIFIER_INT8]
    status, text, err = _build(capsys, *argv, "--classify-for", "square,triangle", "--classify-every", "2", "-o", out)
    assert status == 0, err
    assert "second stage: classifier of 3 classes (circle, square, triangle) for square, triangle, every 2 s" in text
    folder = tmp_path / "unpacked"
    unpack(out, folder, Limits())
    return folder


def test_a_two_stage_bundle_carries_the_classifier_and_activation_checks_both(two_stage: Path, capsys) -> None:
    from agent.cli import main

    manifest = json.loads((two_stage / "manifest.json").read_text())
    stage = manifest["classifier"]
    assert stage["labels"] == ["circle", "square", "triangle"], "from the classifier's metadata"
    assert stage["for"] == ["square", "triangle"] and stage["every_s"] == 2.0
    assert [(a["path"], a["precision"]) for a in stage["artifacts"]] == [
        ("demo_classify.onnx", "fp32"),
        ("demo_classify_int8.tflite", "int8"),
    ]
    assert [a["path"] for a in manifest["artifacts"]] == ["demo_detector.onnx"], "the detector's own list unchanged"
    verified = verify_unpacked(two_stage, (), allow_unsigned=True)  # the classifier's files are hashed too
    activation = activate(verified, probe())
    assert activation.artifact == "demo_detector.onnx" and activation.classifier == "demo_classify.onnx"
    assert activation.classifier_parity is not None and activation.classifier_parity >= 0.99
    status = main(["bundle", "inspect", str(two_stage.parent / "two.bundle")])
    out = capsys.readouterr().out
    assert status == 0 and "classifier demo_classify_int8.tflite: tflite int8" in out


def test_the_governors_lighter_artifact_applies_to_the_classifier(two_stage: Path) -> None:
    usual = open_classifier(two_stage, probe())
    lighter = open_classifier(two_stage, probe(), lighter=True)
    assert usual is not None and lighter is not None
    try:
        assert usual.choice.artifact.precision == "fp32" and lighter.choice.artifact.precision == "int8"
        assert lighter.choice.runtime == "litert" and "for the governor" in lighter.choice.reason
        crop = np.full((40, 40, 3), 60, np.uint8)
        assert lighter.classifier.classify(crop).scores.shape == (3,)
    finally:
        usual.close()
        lighter.close()


def test_an_older_bundle_has_no_second_stage(tmp_path: Path, capsys) -> None:
    out = tmp_path / "one.bundle"
    status, _, err = _build(capsys, "--model", DETECTOR, "-o", out)
    assert status == 0, err
    folder = tmp_path / "one"
    unpack(out, folder, Limits())
    assert "classifier" not in json.loads((folder / "manifest.json").read_text())
    assert open_classifier(folder, probe()) is None
    assert activate(verify_unpacked(folder, (), allow_unsigned=True), probe()).classifier is None


def _edited(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    manifest = json.loads((folder / "manifest.json").read_text())
    edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_activation_refuses_a_classifier_that_does_not_fit_its_labels(two_stage: Path) -> None:
    _edited(two_stage, lambda m: m["classifier"].update(labels=["a", "b"]))
    with pytest.raises(BundleError) as refused:
        activate(verify_unpacked(two_stage, (), allow_unsigned=True), probe())
    assert refused.value.code == ErrorCode.CLASSIFIER_MISMATCH
    assert "demo_classify.onnx gives 3 class scores for 2 labels in the manifest" in str(refused.value)
    with pytest.raises(BundleError) as serving:
        open_classifier(two_stage, probe())
    assert serving.value.code == ErrorCode.CLASSIFIER_MISMATCH


def test_activation_checks_the_classifiers_parity(two_stage: Path) -> None:
    reference = dict(np.load(two_stage / "reference.npz"))
    reference["demo_classify.onnx__output0"] = reference["demo_classify.onnx__output0"][:, ::-1].copy()
    np.savez(two_stage / "reference.npz", **reference)
    from agent.bundles.archive import Verified, read_manifest  # the reference is hashed: the Verified by hand

    _, manifest = read_manifest(two_stage)
    with pytest.raises(BundleError) as refused:
        activate(Verified(two_stage, manifest, None, reference), probe())
    assert refused.value.code == ErrorCode.PARITY_FAILED and "demo_classify.onnx" in str(refused.value)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--classifier", "missing.onnx"], "classifier model file not found: missing.onnx"),
        (
            ["--classifier", DETECTOR],
            "CLASSIFIER_MISMATCH: classifier demo_detector.onnx: a classifier gives one output",
        ),
        (["--classifier", CLASSIFIER, "--classify-labels", ""], "--classify-labels: every label needs a name, got ''"),
        (["--classifier", CLASSIFIER, "--classify-labels", "a,,c"], "--classify-labels: every label needs a name"),
        (
            ["--classifier", CLASSIFIER, "--classify-labels", "red,green"],
            "CLASSIFIER_MISMATCH: classifier demo_classify.onnx gives 3 class scores, but 2 labels were given",
        ),
        (["--classifier", CLASSIFIER, "--classify-labels", "{empty}"], "the labels file {empty} names no label"),
        (
            ["--classifier", CLASSIFIER, "--classify-for", "dog"],
            "CLASSIFIER_MISMATCH: the classifier is for dog, which the detector's labels (circle, square, triangle)",
        ),
        (["--classifier", CLASSIFIER, "--classify-for", "square,"], "--classify-for: every label needs a name"),
        (["--classify-labels", "a,b"], "--classify-labels need --classifier MODEL"),
        (["--classifier", DEMO_MODELS / "labels.txt"], "classifier labels.txt: expected an .onnx or .tflite model"),
    ],
)
def test_bad_classifier_input_is_refused_by_name(argv: list, words: str, tmp_path: Path, capsys) -> None:  # type: ignore[type-arg]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    argv = [str(a).replace("{empty}", str(empty)) for a in argv]
    out = tmp_path / "x.bundle"
    status, _, err = _build(capsys, "--model", DETECTOR, *argv, "-o", out)
    assert status == 1 and words.replace("{empty}", str(empty)) in err, err
    assert not out.exists()


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
def test_classify_every_must_be_seconds_above_zero(value: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as usage:
        _build(capsys, "--model", DETECTOR, "--classifier", CLASSIFIER, "--classify-every", value, "-o", tmp_path / "x")
    assert usage.value.code == 2
    assert f"--classify-every: expected a number of seconds above 0, got {value!r}" in capsys.readouterr().err
