"""`agent.optimise.prepare`: variants ship with their agreement; the gate refuses a blank calibration set's INT8."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import cv2
import onnx
import pytest
from onnx import TensorProto
from testkit.optimise import FP32, _build

from agent.bundles.archive import Limits, unpack


def _manifest(capsys: pytest.CaptureFixture[str], bundle: Path) -> dict:
    from agent.cli import main

    assert main(["bundle", "inspect", str(bundle), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_variants_ship_with_their_agreement(tmp_path: Path, scenes: Path, capsys) -> None:
    from agent.cli import main

    out = tmp_path / "demo.bundle"
    status, printed, _ = _build(
        capsys, "--model", FP32, "--precisions", "fp32,fp16,int8", "--calibration", scenes, "--name", "demo", "-o", out
    )
    assert status == 0, printed
    assert "demo_detector.onnx: opset 17, IR 8, fp32" in printed and "images[0]=batch" in printed
    manifest = _manifest(capsys, out)
    artifacts = {a["precision"]: a for a in manifest["artifacts"]}
    assert [a["precision"] for a in manifest["artifacts"]] == ["fp32", "fp16", "int8"]
    assert "agreement" not in artifacts["fp32"]  # the baseline; and older agents read such entries
    for precision in ("fp16", "int8"):
        agreement = artifacts[precision]["agreement"]
        assert agreement["baseline"] == "demo_detector.onnx" and agreement["images"] == 8
        assert agreement["baseline_detections"] >= 8  # five shapes a frame: the FP32 model finds them
        assert agreement["detections"] == pytest.approx(agreement["matched"] / agreement["baseline_detections"], 1e-3)
        assert 0.9 <= agreement["detections"] <= 1.0 and agreement["min_agreement"] == 0.9
        assert agreement["max_abs_error"] > 0  # a different model, measured: not a copy of FP32
    assert artifacts["fp16"]["agreement"]["max_abs_error"] < 0.01 < artifacts["int8"]["agreement"]["max_abs_error"]
    assert artifacts["int8"]["size"] * 2.5 <= artifacts["fp32"]["size"]
    assert artifacts["fp16"]["size"] * 1.8 <= artifacts["fp32"]["size"]
    assert main(["bundle", "inspect", str(out)]) == 0
    table = capsys.readouterr().out
    assert re.search(r"demo_detector_int8\.onnx\s+int8\s+\d+\s+(0\.9\d\d|1\.000)\s+\d+/\d+", table), table
    # a device installs it: verified, loaded, parity checked against the reference of its artifact
    state = ["--state-dir", str(tmp_path / "state"), "--allow-unsigned"]
    assert main(["install", str(out), *state]) == 0, capsys.readouterr().err
    folder = tmp_path / "unpacked"
    folder.mkdir()
    unpack(out, folder, Limits())
    for name in ("demo_detector_fp16.onnx", "demo_detector_int8.onnx"):
        model = onnx.load(str(folder / name))
        assert [i.type.tensor_type.elem_type for i in model.graph.input] == [TensorProto.FLOAT], "FP32 input kept"
        assert {p.key for p in model.metadata_props} >= {"names", "imgsz", "stride"}
    int8_ops = {n.op_type for n in onnx.load(str(folder / "demo_detector_int8.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= int8_ops


def test_a_blank_calibration_set_gives_an_int8_variant_the_gate_refuses(
    tmp_path: Path, scenes: Path, blank: Path, capsys
) -> None:
    out = tmp_path / "b.bundle"
    argv = ["--model", FP32, "--calibration", blank, "--validation", scenes, "-o", out]
    status, printed, _ = _build(capsys, *argv, "--precisions", "fp32,int8")
    assert status == 0, printed
    found = re.search(r"int8\.onnx \(int8\): left out: detection agreement (\d\.\d+) is (\d\.\d+) below", printed)
    assert found, printed
    agreement, gap = map(float, found.groups())
    assert agreement < 0.5 and gap == pytest.approx(0.9 - agreement, abs=1e-3)
    assert "--int8-activations asymmetric" in printed  # what to try next
    assert [a["precision"] for a in _manifest(capsys, out)["artifacts"]] == ["fp32"]
    # nothing else asked for: no bundle at all, and the number says why
    status, _, err = _build(capsys, *argv, "--precisions", "int8")
    assert status == 1 and "NO_ARTIFACT_KEPT" in err and f"agreement {agreement:.3f}" in err


@pytest.mark.models
def test_a_real_coco_model_gets_a_checked_fp16_variant(tmp_path: Path, shared_models: Path, photos, capsys) -> None:
    """YOLOX-Nano (FP32, opset 11): simplified only where that is lossless, its FP16 variant proven
    on photos."""
    validation = tmp_path / "photos"
    validation.mkdir()
    for name, path in photos.items():
        image = cv2.imread(str(path))
        cv2.imwrite(str(validation / f"{name}.png"), image)
        cv2.imwrite(str(validation / f"{name}_flipped.png"), image[:, ::-1])
    out = tmp_path / "yolox.bundle"
    labels = shared_models / "coco80_labels.txt"
    argv = ["--model", shared_models / "yolox_nano_416.onnx", "--labels", labels, "--validation", validation]
    status, printed, _ = _build(capsys, *argv, "--precisions", "fp32,fp16", "-o", out)
    assert status == 0, printed
    assert "yolox_nano_416.onnx: opset 11, IR 6, fp32, 369 nodes" in printed
    manifest = _manifest(capsys, out)
    assert manifest["decoder"] == "yolox"
    # onnxslim 0.1.98 simplifies it losslessly; 0.1.48 (the oldest supported) changed its outputs
    # (by up to 2.07): then the model must ship exactly as given
    shipped = manifest["artifacts"][0]
    original = hashlib.sha256((shared_models / "yolox_nano_416.onnx").read_bytes()).hexdigest()
    if "simplified by onnxslim: 369 -> 365 nodes, outputs identical" in printed:
        assert shipped["sha256"] != original
    else:
        assert "kept as given: the simplified model's outputs differ (max |difference|" in printed, printed
        assert shipped["sha256"] == original
    fp16 = manifest["artifacts"][1]
    assert fp16["precision"] == "fp16" and fp16["agreement"]["detections"] >= 0.9
    assert fp16["agreement"]["baseline_detections"] >= 4  # a person, a cat, a cup...: found on the photos
