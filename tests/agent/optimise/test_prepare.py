"""`agent.optimise.prepare`: variants ship with their agreement; the gate refuses a blank calibration set's INT8;
task models' INT8 keeps their head in float."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto
from testkit import DEMO_MODELS, REPO
from testkit.optimise import FP32, _build

from agent.bundles.archive import Limits, unpack
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.sources.synthetic import SyntheticScene
from runtimes.registry import load_runtime


def _manifest(capsys: pytest.CaptureFixture[str], bundle: Path) -> dict:
    from agent.cli import main

    assert main(["bundle", "inspect", str(bundle), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _unpacked(bundle: Path, folder: Path) -> Path:
    """`bundle`'s files unpacked into `folder` (made here)."""
    folder.mkdir()
    unpack(bundle, folder, Limits())
    return folder


def _photos_and_mirrors(photos: dict[str, Path], folder: Path) -> Path:
    """Each photo and its mirror image as PNG files in `folder` (made here): twice the images."""
    folder.mkdir()
    for name, path in photos.items():
        image = cv2.imread(str(path))
        cv2.imwrite(str(folder / f"{name}.png"), image)
        cv2.imwrite(str(folder / f"{name}_flipped.png"), image[:, ::-1])
    return folder


@pytest.mark.slow
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
    folder = _unpacked(out, tmp_path / "unpacked")
    for name in ("demo_detector_fp16.onnx", "demo_detector_int8.onnx"):
        model = onnx.load(str(folder / name))
        assert [i.type.tensor_type.elem_type for i in model.graph.input] == [TensorProto.FLOAT], "FP32 input kept"
        assert {p.key for p in model.metadata_props} >= {"names", "imgsz", "stride"}
    int8_ops = {n.op_type for n in onnx.load(str(folder / "demo_detector_int8.onnx")).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= int8_ops


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.models
def test_a_real_coco_model_gets_a_checked_fp16_variant(tmp_path: Path, shared_models: Path, photos, capsys) -> None:
    """YOLOX-Nano (FP32, opset 11): simplified only where that is lossless, its FP16 variant proven
    on photos."""
    validation = _photos_and_mirrors(photos, tmp_path / "photos")
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


#: the head's decode: scores' sigmoid, the box distribution's softmax, scaling to pixels
HEAD_OPS = {"Sigmoid", "Softmax", "Softplus", "Mul", "Sub", "Div"}


def _dequantized_into(model: onnx.ModelProto) -> set[str]:
    """The operators that read a DequantizeLinear's output: what INT8 reaches."""
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {n.op_type for n in model.graph.node if n.op_type != "QuantizeLinear" and dequantized & set(n.input)}


def _paired(a: Detections, b: Detections) -> list[tuple[int, int]]:
    """(i, j): each detection of `a` with the one of `b` of the same class whose box is nearest."""
    pairs = []
    for i in range(len(a)):
        same = np.flatnonzero(b.class_id == a.class_id[i])
        if same.size:
            pairs.append((i, int(same[np.abs(b.xyxy[same] - a.xyxy[i]).sum(axis=1).argmin()])))
    return pairs


@pytest.mark.slow
@pytest.mark.parametrize("task", ["segment", "pose", "obb"])
def test_a_task_model_s_int8_variant_quantizes_its_network_and_keeps_its_head_in_float(
    tmp_path: Path, scenes: Path, capsys, task: str
) -> None:
    """Quantized whole, the demo task models' INT8 variants find nothing (one INT8 scale over
    pixel boxes, scores and mask coefficients or keypoints) and the build tries again with only
    the convolutions quantized: they ship, their masks, keypoints and angles near FP32's."""
    out = tmp_path / f"{task}.bundle"
    model = DEMO_MODELS / f"demo_{task}.onnx"
    status, printed, _ = _build(
        capsys, "--model", model, "--precisions", "fp32,int8", "--calibration", scenes, "-o", out
    )
    assert status == 0, printed
    assert re.search(rf"demo_{task}_int8\.onnx \(int8\): left out: detection agreement 0\.000 ", printed), printed
    kept = rf"demo_{task}_int8\.onnx \(int8, head in float\): kept: detection agreement (0\.9\d\d|1\.000)"
    assert re.search(kept, printed), printed
    folder = _unpacked(out, tmp_path / "unpacked")
    int8 = folder / f"demo_{task}_int8.onnx"
    reached = _dequantized_into(onnx.load(str(int8)))
    assert "Conv" in reached and not reached & HEAD_OPS, "the network quantized, the head left in float"
    frames = [SyntheticScene(640, 480, num_shapes=5, seed=330_000 + i).render(3)[0] for i in range(3)]
    with load_runtime("onnxruntime", model) as fp32, load_runtime("onnxruntime", int8) as quantized:
        pairs = [(Detector(fp32).detect(f), Detector(quantized).detect(f)) for f in frames]
    assert sum(len(a) for a, _ in pairs) >= 3
    gaps = [_gap(task, a, b, i, j) for a, b in pairs for i, j in _paired(a, b)]
    # medians: INT8 calibrated on 8 frames moves some objects more (a keypoint 7 px, a mask 0.85)
    limit = {"segment": 0.1, "pose": 5.0, "obb": 0.1}[task]  # 1 - mask IoU, keypoint px, angle rad
    assert len(gaps) >= 3 and float(np.median(gaps)) <= limit, gaps


def _gap(task: str, a: Detections, b: Detections, i: int, j: int) -> float:
    """How far detection `j` of `b` is from detection `i` of `a`: 1 - their masks' IoU, their
    keypoints' largest distance (px), or their angles' difference (rad)."""
    if task == "segment":
        assert a.masks is not None and b.masks is not None
        x, y = a.masks.bitmap(i), b.masks.bitmap(j)
        return 1.0 - float((x & y).sum() / (x | y).sum())
    if task == "pose":
        assert a.keypoints is not None and b.keypoints is not None
        return float(np.abs(a.keypoints[i, :, :2] - b.keypoints[j, :, :2]).max())
    assert a.xywhr is not None and b.xywhr is not None
    return abs(float(a.xywhr[i, 4] - b.xywhr[j, 4]))


def test_a_box_detector_s_int8_variant_is_quantized_whole_as_before(tmp_path: Path, scenes: Path, capsys) -> None:
    """The demo detector passes the gate quantized whole: no second try, the head quantized too."""
    out = tmp_path / "d.bundle"
    status, printed, _ = _build(capsys, "--model", FP32, "--precisions", "int8", "--calibration", scenes, "-o", out)
    assert status == 0, printed
    assert "demo_detector_int8.onnx (int8): kept" in printed and "head in float" not in printed
    folder = _unpacked(out, tmp_path / "unpacked")
    assert _dequantized_into(onnx.load(str(folder / "demo_detector_int8.onnx"))) & HEAD_OPS


@pytest.mark.slow
@pytest.mark.models
def test_yolov8n_s_int8_variant_ships_with_its_head_in_float(
    tmp_path: Path, shared_models: Path, photos, capsys
) -> None:
    """The real YOLOv8n (COCO weights, FP32 from bench/yolov8n_fp32.py): quantized whole it matches
    none of FP32's detections on photos; with its head in float it passes the gate."""
    model = tmp_path / "yolov8n_640.onnx"
    source = shared_models / "yolov8n_int8_640.onnx"
    script = REPO / "bench" / "yolov8n_fp32.py"
    subprocess.run([sys.executable, str(script), "--source", str(source), "--out", str(model)], check=True)
    folder = _photos_and_mirrors(photos, tmp_path / "photos")
    labels = shared_models / "coco80_labels.txt"
    out = tmp_path / "y.bundle"
    argv = ["--model", model, "--labels", labels, "--calibration", folder, "--precisions", "fp32,int8", "-o", out]
    status, printed, _ = _build(capsys, *argv)
    assert status == 0, printed
    assert re.search(r"yolov8n_640_int8\.onnx \(int8\): left out: detection agreement 0\.[0-8]", printed), printed
    found = re.search(r"\(int8, head in float\): kept: detection agreement (\d\.\d+) \((\d+) of (\d+)", printed)
    assert found, printed
    assert float(found.group(1)) >= 0.9 and int(found.group(3)) >= 8  # people, a cat, a cup...
    assert [a["precision"] for a in _manifest(capsys, out)["artifacts"]] == ["fp32", "int8"]


@pytest.mark.slow
def test_the_openvino_int8_variant_ships_as_an_ir_proven_on_openvino(tmp_path: Path, scenes: Path, capsys) -> None:
    """`--openvino-int8`: NNCF's IR beside the FP32 model, its agreement measured on OpenVINO, its
    weights hashed in files; a device verifies it, measures it on OpenVINO alone and serves it
    when autotune chooses it."""
    pytest.importorskip("nncf", reason="the nncf extra is not installed")
    from agent.bundles.archive import verify_unpacked
    from agent.bundles.tuning import Tuning, candidates
    from agent.cli import main
    from agent.errors import BundleError
    from agent.hardware.board import probe
    from agent.serving.loader import open_detector
    from runtimes.registry import RuntimeSettings

    out = tmp_path / "ov.bundle"
    argv = ["--model", FP32, "--precisions", "fp32", "--openvino-int8", "--calibration", scenes, "-o", out]
    status, printed, _ = _build(capsys, *argv)
    assert status == 0, printed
    assert re.search(r"int8_openvino\.xml \(int8, NNCF, OpenVINO IR\): kept: detection agreement", printed), printed
    manifest = _manifest(capsys, out)
    ir = manifest["artifacts"][1]
    assert [(a["path"], a["format"], a["precision"]) for a in manifest["artifacts"]] == [
        ("demo_detector.onnx", "onnx", "fp32"),
        ("demo_detector_int8_openvino.xml", "openvino", "int8"),
    ]
    assert ir["agreement"]["baseline"] == "demo_detector.onnx" and ir["agreement"]["detections"] >= 0.9
    assert ir["agreement"]["max_abs_error"] > 0  # quantized, measured
    assert main(["bundle", "inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"artifact demo_detector_int8_openvino\.xml: openvino int8, \d+ bytes \(\+ weights "
                     r"demo_detector_int8_openvino\.bin, \d+ bytes\)", shown), shown  # fmt: skip
    folder = _unpacked(out, tmp_path / "unpacked")
    xml = (folder / "demo_detector_int8_openvino.xml").read_text()
    assert 'type="FakeQuantize"' in xml and 'type="Sigmoid"' in xml  # the network in INT8, the head's scores float
    weights = next(f for f in manifest["files"] if f["path"] == "demo_detector_int8_openvino.bin")
    assert weights["sha256"] == hashlib.sha256((folder / weights["path"]).read_bytes()).hexdigest()
    verified = verify_unpacked(folder, [], allow_unsigned=True)
    rows = candidates(verified.folder, verified.manifest, probe(), RuntimeSettings())
    assert {row.runtime for row in rows if row.artifact == ir["path"]} == {"openvino"}  # autotune measures it there
    chosen = Tuning("openvino", "CPU", ir["path"], "int8", 1, 1, 100.0, 9.0, "fastest")
    loaded = open_detector(verified.folder, probe(), tuning=chosen)  # what autotune's choice serves
    assert (loaded.choice.runtime, Path(loaded.choice.artifact.path).name) == ("openvino", ir["path"])
    frame = SyntheticScene(seed=11, num_shapes=5).render(4)[0]
    assert len(loaded.detector.detect(frame)) >= 3
    loaded.detector.runtime.close()
    # weights changed after signing or in transit: the device refuses the bundle, naming the file
    (folder / weights["path"]).write_bytes(b"\0" * weights["size"])
    with pytest.raises(BundleError, match=r"demo_detector_int8_openvino\.bin sha256 [0-9a-f]+\.\.\. differs"):
        verify_unpacked(folder, [], allow_unsigned=True)


def test_the_openvino_int8_variant_needs_its_options(tmp_path: Path, scenes: Path, capsys) -> None:
    out = str(tmp_path / "x.bundle")
    status, _, err = _build(capsys, "--model", FP32, "--openvino-int8", "--calibration", scenes, "-o", out)
    assert status == 1 and "--openvino-int8 is a variant of the FP32 model: give --precisions too" in err
    status, _, err = _build(capsys, "--model", FP32, "--precisions", "fp32", "--openvino-int8", "-o", out)
    assert status == 1 and "--openvino-int8 needs calibration images" in err
