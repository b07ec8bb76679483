"""`edge-agent engine build` against the TensorRT test double: from ONNX and from a bundle, its errors,
the prebuilt engine a bundle carries, INT8 from a bundle's calibration images."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.trt_double import TrtDouble

from agent.bundles.archive import Limits, unpack, verify_unpacked
from agent.bundles.engine_settings import prebuilt_engines
from agent.cli.main import main
from runtimes.tensorrt_backend import TensorRTConfig
from runtimes.tensorrt_engines import prepare_engine

ONNX = DEMO_MODELS / "demo_detector.onnx"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_engine_build_of_an_onnx_model_then_from_the_cache(
    trt_double: TrtDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = str(tmp_path / "state")
    status, out, _ = run(capsys, "engine", "build", str(ONNX), "--state-dir", state)
    assert status == 0 and out.startswith("engine built in ") and str(tmp_path / "state" / "engines") in out
    assert "fp16 on Orin (test double) (sm 8.7), TensorRT 10.13.0.35" in out
    status, out, _ = run(capsys, "engine", "build", str(ONNX), "--state-dir", state, "--json")
    report = json.loads(out)
    assert status == 0 and report["how"] == "cache" and report["key"]["precision"] == "fp16"
    status, out, _ = run(capsys, "engine", "build", str(ONNX), "--state-dir", state, "--json", "--precision", "fp32")
    assert json.loads(out)["how"] == "built" and json.loads(out)["key"]["precision"] == "fp32"


def test_engine_build_errors_are_one_line(
    trt_double: TrtDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = str(tmp_path / "state")
    with pytest.raises(SystemExit) as caught:
        main(["engine", "build", str(ONNX), "--profile", "1,3,320:1,3,320"])
    assert caught.value.code == 2
    assert "expected MIN:OPT:MAX shapes" in capsys.readouterr().err
    trt_double.internals.UNSUPPORTED_OPS.add("Conv")
    status, _, err = run(capsys, "engine", "build", str(ONNX), "--state-dir", state)
    assert status == 1 and err.count("\n") == 1
    assert "TensorRT cannot parse demo_detector.onnx: node 0 (Conv" in err
    status, _, err = run(capsys, "engine", "build", str(tmp_path / "missing.onnx"), "--state-dir", state)
    assert status == 1 and "not found" in err


def test_without_tensorrt_engine_build_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "engine", "build", str(ONNX), "--state-dir", str(tmp_path))
    assert status == 1 and "tensorrt (JetPack / TensorRT wheel) is not installed" in err


def test_a_prebuilt_engine_travels_in_a_bundle_and_is_used_on_a_match(
    trt_double: TrtDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str], keys: dict[str, Path]
) -> None:
    engine = tmp_path / "out" / "demo.orin.fp16.engine"
    status, _, _ = run(capsys, "engine", "build", str(ONNX), "--state-dir", str(tmp_path / "s1"), "--out", str(engine))
    assert status == 0 and engine.is_file() and json.loads(Path(f"{engine}.json").read_text())["key"]["gpu_name"]
    bundle = tmp_path / "demo.bundle"
    status, _, _ = run(
        capsys,
        "bundle",
        "build",
        "--model",
        str(ONNX),
        "--engine",
        str(engine),
        "-o",
        str(bundle),
        "--key",
        str(keys["private"]),
    )
    assert status == 0
    folder = tmp_path / "unpacked"
    folder.mkdir()
    unpack(bundle, folder, Limits())
    manifest = verify_unpacked(folder, (), allow_unsigned=True).manifest
    (tags,) = manifest.engines
    assert tags.artifact == "demo_detector.onnx" and tags.gpu_name == "Orin (test double)" and tags.precision == "fp16"
    assert tags.path in {f.path for f in manifest.files}, "the engine is hashed like every file"
    config = TensorRTConfig(engine_cache_dir=tmp_path / "device")
    assert (
        prepare_engine(folder / "demo_detector.onnx", config, prebuilt=prebuilt_engines(folder, manifest)).how
        == "prebuilt"
    )
    trt_double.internals.GPU.name = "Xavier"  # another board: the shipped engine does not fit
    config = TensorRTConfig(engine_cache_dir=tmp_path / "xavier")
    assert (
        prepare_engine(folder / "demo_detector.onnx", config, prebuilt=prebuilt_engines(folder, manifest)).how
        == "built"
    )


def test_int8_from_a_bundles_calibration_images(
    trt_double: TrtDouble, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    images = tmp_path / "images"
    images.mkdir()
    for i in range(3):
        cv2.imwrite(str(images / f"{i}.png"), np.full((240, 320, 3), 40 * i, np.uint8))
    bundle = tmp_path / "demo.bundle"
    status, _, _ = run(capsys, "bundle", "build", "--model", str(ONNX), "--calibration", str(images), "-o", str(bundle))
    assert status == 0
    status, out, _ = run(
        capsys, "engine", "build", str(bundle), "--precision", "int8", "--state-dir", str(tmp_path / "s"), "--json"
    )
    report = json.loads(out)
    assert status == 0 and report["built_precision"] == "int8" and report["int8_source"] == "calibration"
    assert trt_double.internals.builds[-1]["calibrated"]
    assert list((tmp_path / "s" / "engines").glob("calibration-*.cache")), "the calibration cache is kept"
