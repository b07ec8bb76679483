"""`edge-agent bundle build`: the optimisation options' errors come before any work; the detection
thresholds signed into the manifest, shown by inspect, judged by the guard as a device will."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import DEMO_MODELS
from testkit.optimise import FP32, _build


@pytest.mark.parametrize(
    ("argv", "code", "words"),
    [
        (["--precisions", "int8"], "CALIBRATION_REQUIRED", "--calibration DIR"),
        (["--precisions", "fp32,fp16"], "VALIDATION_REQUIRED", "--validation DIR"),
        (["--precisions", "fp16", "--calibration", "{scenes}", "--model-instead", "int8"], "NOT_FP32_MODEL", "is int8"),
        (["--precisions", "fp16", "--model-instead", "tflite"], "NOT_FP32_MODEL", "needs an FP32 .onnx model"),
    ],
)
def test_clear_errors_before_any_work(argv: list[str], code: str, words: str, tmp_path: Path, scenes: Path, capsys):
    model = FP32
    if "--model-instead" in argv:
        kind = argv[argv.index("--model-instead") + 1]
        argv = argv[: argv.index("--model-instead")]
        model = DEMO_MODELS / ("demo_detector_int8_qdq.onnx" if kind == "int8" else "demo_detector_fp32.tflite")
    argv = [a.replace("{scenes}", str(scenes)) for a in argv]
    status, _, err = _build(capsys, "--model", model, *argv, "-o", tmp_path / "x.bundle")
    assert status == 1 and f"error: {code}:" in err and words in err, err


@pytest.mark.parametrize("bad", ["int9", "fp32,,bf16", ""])
def test_unknown_precisions_are_a_usage_error(bad: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as usage:
        _build(capsys, "--model", FP32, "--precisions", bad, "-o", tmp_path / "x.bundle")
    assert usage.value.code == 2
    assert "--precisions: expected a comma-separated list of fp32, fp16, int8" in capsys.readouterr().err


def test_build_signs_the_thresholds_into_the_manifest_and_a_device_serves_with_them(
    tmp_path: Path, keys: dict[str, Path], capsys
) -> None:
    import json

    from agent.bundles.archive import Limits, unpack, verify_unpacked
    from agent.bundles.signing import load_public_key
    from agent.cli import main
    from agent.hardware.board import probe
    from agent.serving.loader import open_detector
    from pipelines.decoding.detection_filter import DetectionFilter

    out = tmp_path / "demo.bundle"
    argv = ["--model", FP32, "--key", keys["private"], "--conf", "0.4", "--iou", "0.6", "--max-det", "50"]
    status, _, err = _build(capsys, *argv, "-o", out)
    assert status == 0, err
    assert main(["bundle", "inspect", str(out)]) == 0
    assert "  thresholds: conf 0.4, iou 0.6, max_det 50\n" in capsys.readouterr().out
    assert main(["bundle", "inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["thresholds"] == {"conf": 0.4, "iou": 0.6, "max_det": 50}
    folder = tmp_path / "unpacked"
    unpack(out, folder, Limits())
    verify_unpacked(folder, [load_public_key(keys["public"])], allow_unsigned=False)  # the signature covers them
    loaded = open_detector(folder, probe())
    assert loaded.detector.detection_filter == DetectionFilter(conf=0.4, iou=0.6, max_det=50)
    loaded.detector.close()

    status, _, err = _build(capsys, "--model", FP32, "-o", tmp_path / "plain.bundle")
    assert status == 0, err
    assert main(["bundle", "inspect", str(tmp_path / "plain.bundle")]) == 0
    assert "  thresholds: conf 0.25, iou 0.45, max_det 300\n" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.models
def test_an_ultralytics_export_is_bundled_with_ultralytics_thresholds_unless_asked(
    tmp_path: Path, shared_models: Path, capsys
) -> None:
    """Issue 37: a model whose metadata names Ultralytics as its author gets Ultralytics' own
    defaults (conf 0.25, iou 0.7) signed into the manifest, so a device answers as `yolo
    predict` does; a value asked for is signed instead, the others still the exporter's."""
    from agent.cli import main

    model = shared_models / "yolov8n_int8_640.onnx"
    for extra, line in [
        ((), "  thresholds: conf 0.25, iou 0.7, max_det 300\n"),
        (("--iou", "0.5", "--max-det", "20"), "  thresholds: conf 0.25, iou 0.5, max_det 20\n"),
    ]:
        out = tmp_path / f"coco{len(extra)}.bundle"
        status, _, err = _build(capsys, "--model", model, *extra, "-o", out)
        assert status == 0, err
        assert main(["bundle", "inspect", str(out)]) == 0
        assert line in capsys.readouterr().out


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("--conf", "1.5", "--conf: expected a number within 0..1, got 1.5"),
        ("--iou", "-0.2", "--iou: expected a number within 0..1, got -0.2"),
        ("--max-det", "0", "--max-det: expected a positive integer, got 0"),
    ],
)
def test_thresholds_out_of_range_are_a_usage_error(option: str, value: str, words: str, tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as usage:
        _build(capsys, "--model", FP32, f"{option}={value}", "-o", tmp_path / "x.bundle")
    assert usage.value.code == 2 and words in capsys.readouterr().err


def test_the_guard_judges_the_model_with_the_bundles_thresholds(tmp_path: Path, constant_model, capsys) -> None:
    """Two boxes survive NMS on a blank frame at --iou 0.7: more than --max-det 1 allows, so the
    device would refuse the model; the build refuses it first. At the defaults it builds."""
    from testkit.onnx_models import two_overlapping_boxes

    model = two_overlapping_boxes(constant_model)
    argv = ["--model", model, "--decoder", "yolov8", "-o", tmp_path / "x.bundle"]
    status, _, err = _build(capsys, *argv, "--iou", "0.7", "--max-det", "1")
    assert status == 1 and "DECODER_MISMATCH" in err and "more than max_det 1" in err, err
    assert _build(capsys, *argv)[0] == 0


@pytest.mark.parametrize(
    ("target", "words"),
    [("llvm mcpu", "'mcpu' is not an option like -mcpu=cortex-a76"), ('{"mcpu": "x"}', "a JSON object with a kind")],
)
def test_a_malformed_tvm_target_is_refused_before_any_work(target: str, words: str, tmp_path: Path, capsys) -> None:
    status, _, err = _build(capsys, "--model", FP32, "--tvm-target", target, "-o", tmp_path / "x.bundle")
    assert status == 1 and "--tvm-target: target" in err and words in err, err
    assert not (tmp_path / "x.bundle").exists()


@pytest.mark.tvm
def test_tvm_modules_and_their_target_are_in_the_manifest(tmp_path: Path, capsys) -> None:
    """`bundle build --tvm-target` for a Pi 5 (cross-compiled here): the module and its record are
    in the bundle, its target in the manifest, printed by inspect."""
    from testkit.tvm_modules import PI5_TARGET, needs_cross_gcc, needs_tvm

    from agent.cli import main

    needs_tvm()
    needs_cross_gcc()
    out = tmp_path / "pi5.bundle"
    status, _, err = _build(capsys, "--model", FP32, "--tvm-target", PI5_TARGET, "-o", out)
    assert status == 0, err
    assert main(["bundle", "inspect", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "artifact demo_detector.aarch64-cortex-a76.so: tvm fp32" in shown and "for aarch64" in shown, shown


@pytest.mark.rknn
@pytest.mark.slow
def test_an_rknn_model_is_converted_proven_in_the_simulator_and_recorded(tmp_path: Path, scenes: Path, capsys) -> None:
    """`bundle build --rknn rk3588`: rknn-toolkit2 converts the demo detector (INT8 on the
    calibration scenes) in its own venv, its simulator's detections pass the agreement gate
    against ONNX Runtime's, and the model, its record, target and agreement are in the bundle."""
    from testkit.rknn_double import toolkit_python

    from agent.bundles.archive import read_bundle_manifest
    from agent.cli import main

    python = toolkit_python()
    out = tmp_path / "rock5b.bundle"
    argv = ["--model", FP32, "--calibration", scenes, "--rknn", "rk3588", "--rknn-python", python, "-o", out]
    status, said, err = _build(capsys, *argv)
    assert status == 0, err
    assert "demo_detector.rk3588.rknn: kept: detection agreement" in said, said
    manifest = read_bundle_manifest(out).manifest
    (rknn,) = [a for a in manifest.artifacts if a.format == "rknn"]
    assert rknn.precision == "int8" and rknn.target is not None and rknn.target.target == "rk3588"
    assert rknn.agreement is not None and rknn.agreement.detections >= rknn.agreement.min_agreement == 0.9
    assert "demo_detector.rk3588.rknn.json" in {f.path for f in manifest.files}
    assert main(["bundle", "inspect", str(out)]) == 0
    assert "for aarch64 rk3588 (rknn-toolkit2 2." in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--agent", "--wheel", "{wheel}"],
            "an agent bundle is code: devices install it only signed; give the signing key with --key",
        ),
        (["--agent", "--key", "{key}"], "bundle build --agent needs edge-agent's wheel: --wheel PATH"),
        (
            ["--agent", "--key", "{key}", "--wheel", "{wheel}", "--model", "{wheel}"],
            "carries wheels (--wheel), not models",
        ),
        (["--wheel", "{wheel}", "--key", "{key}"], "--wheel, --python and --arch build agent bundles: add --agent"),
        (["--agent", "--key", "{key}", "--wheel", "{wheel}", "--python", "cp310", "--arch", "aarch64"], ""),
        (
            ["--agent", "--key", "{key}", "--wheel", "{numpy}", "--wheel", "{wheel}", "--arch", "x86_64"],
            "AGENT_UPDATE_WRONG_ARCHITECTURE: numpy-2.1.0-cp311-cp311-manylinux_2_17_aarch64.whl does not fit "
            "the bundle's target: it is for manylinux_2_17_aarch64, the bundle for x86_64",
        ),
        (
            ["--agent", "--key", "{key}", "--wheel", "{numpy}"],
            "AGENT_UPDATE_MALFORMED: an agent bundle holds one edge-agent wheel, not 0",
        ),
    ],
)
def test_bundle_build_agent(argv: list[str], words: str, tmp_path: Path, keys: dict[str, Path], capsys) -> None:
    from agent.cli import main

    wheel, numpy = (
        tmp_path / "edge_agent-0.3.0-py3-none-any.whl",
        tmp_path / "numpy-2.1.0-cp311-cp311-manylinux_2_17_aarch64.whl",
    )
    wheel.write_bytes(b"a wheel")
    numpy.write_bytes(b"numpy")
    names = {"{wheel}": str(wheel), "{numpy}": str(numpy), "{key}": str(keys["private"])}
    out = tmp_path / "agent.bundle"
    status = main(["bundle", "build", *[names.get(a, a) for a in argv], "-o", str(out)])
    said = capsys.readouterr()
    if not words:
        assert status == 0 and "edge-agent 0.3.0 for cp310 on aarch64, 1 wheel(s), signed" in said.out, said
        assert main(["bundle", "inspect", str(out)]) == 0
        assert "agent bundle: edge-agent 0.3.0, for cp310 on aarch64" in capsys.readouterr().out
        return
    assert status == 1 and words in said.err and not out.exists(), said


def test_a_hef_ships_beside_its_onnx_model_recorded_with_the_chip_its_header_names(tmp_path: Path, capsys) -> None:
    """`bundle build --hef` (a HEF from Hailo's compiler, here the double's): the HEF and its record
    ship beside the ONNX model, the manifest names its chip and compiler release, the output says
    it was not run here, and a file that is no HEF is refused naming it before any work."""
    # fails on: .hef refused by the archive, the chip not recorded (no TARGET_MISMATCH before
    # activation), the HEF's reference not its pixels, or a junk file shipped as a HEF
    import numpy as np
    from testkit import hailo_double

    from agent.bundles.archive import Limits, read_bundle_manifest, unpack, verify_unpacked
    from agent.cli import main

    hef = hailo_double.write_hef(tmp_path / "demo.hailo10h.hef", FP32, hw_arch="hailo1xh", sdk_version="5.1.0")
    out = tmp_path / "hat2.bundle"
    status, said, err = _build(capsys, "--model", FP32, "--hef", hef, "-o", out)
    assert status == 0, err
    assert "demo.hailo10h.hef: HEF for hailo1xh (runs on Hailo-10H/Hailo-15H; Dataflow Compiler 5.1.0)" in said
    assert "not run here (no Hailo chip), so no agreement measured" in said, said
    manifest = read_bundle_manifest(out).manifest
    (shipped,) = [a for a in manifest.artifacts if a.format == "hef"]
    assert shipped.target is not None and (shipped.target.target, shipped.target.runtime_version) == (
        "hailo1xh",
        "5.1.0",
    )
    assert shipped.precision == "int8" and shipped.agreement is None
    unpack(out, tmp_path / "unpacked", Limits(), trust=None)
    verified = verify_unpacked(tmp_path / "unpacked", (), allow_unsigned=True)
    pixels = verified.reference["demo.hailo10h.hef__input"]
    onnx_input = verified.reference["demo_detector.onnx__input"]
    assert pixels.shape == (1, 320, 320, 3) and pixels.dtype == np.uint8
    np.testing.assert_allclose(pixels.transpose(0, 3, 1, 2) / 255.0, onnx_input, atol=0.5 / 255)
    record = json.loads((tmp_path / "unpacked" / "demo.hailo10h.hef.json").read_text())
    assert record["hw_arch"] == "hailo1xh" and record["metadata"]["names"].startswith("{0: 'circle'")
    assert main(["bundle", "inspect", str(out)]) == 0
    assert "artifact demo.hailo10h.hef: hef int8" in (shown := capsys.readouterr().out), shown
    assert "for hailo1xh (Dataflow Compiler 5.1.0)" in shown, shown

    junk = tmp_path / "yolov8n.hef"
    junk.write_bytes(b"PK\x03\x04 a zip, not a HEF" + bytes(64))
    status, said, err = _build(capsys, "--model", FP32, "--hef", junk, "-o", tmp_path / "junk.bundle")
    assert status == 1 and "error: UNKNOWN_FORMAT: --hef" in err and "yolov8n.hef is not a HEF" in err, err
    assert "demo_detector.onnx" not in said, "refused before the ONNX model is looked at"
    status, _, err = _build(capsys, "--model", hef, "-o", tmp_path / "x.bundle")
    assert status == 1 and "UNKNOWN_FORMAT" in err and "bundle build --hef" in err, err
