"""`runtimes.rknn_backend`: the device path through a double of rknn-toolkit-lite2's `RKNNLite`
(`testkit.rknn_double`, the ONNX model underneath) on a fake RK3588 board: the same detections
as ONNX Runtime, NHWC in, the core mask only on the RK3588; a model for another SoC refused with
``TARGET_MISMATCH`` before RKNNLite opens it; an rknnlite that does not import disables only this
backend, with one log line."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS, FAKES, rknn_double
from testkit.rknn_double import double_rknn

from pipelines.decoding.detector import Detector
from pipelines.measure.parity import detection_agreement
from pipelines.sources.synthetic import SyntheticScene
from runtimes.base import BundleModel, ModelLoadError, RuntimeInfo, RuntimeUnavailable
from runtimes.ort_backend import OnnxRuntimeBackend
from runtimes.registry import available_runtimes, load_runtime
from runtimes.rknn_backend import RKNNRecord, TargetMismatch, availability, candidates, host_platform
from runtimes.rknn_settings import RKNNConfig, rockchip_soc

DEMO = DEMO_MODELS / "demo_detector.onnx"
ROCK5B = FAKES / "rock5b" / "proc" / "device-tree" / "compatible"


def _board(tmp_path: Path, *compatible: str) -> Path:
    path = tmp_path / "compatible"
    path.write_bytes(b"".join(c.encode() + b"\x00" for c in compatible))
    return path


def test_the_soc_is_read_from_the_device_tree(tmp_path: Path) -> None:
    assert host_platform(ROCK5B) == "rk3588"
    assert host_platform(_board(tmp_path, "xunlong,orangepi-5", "rockchip,rk3588s")) == "rk3588"
    assert host_platform(_board(tmp_path, "radxa,rock-3a", "rockchip,rk3568")) == "rk3568"
    assert host_platform(_board(tmp_path, "raspberrypi,5-model-b", "brcm,bcm2712")) is None
    assert host_platform(tmp_path / "missing") is None
    assert rockchip_soc(["rockchip,rk3399"]) is None, "no NPU that rknn-toolkit-lite2 drives"


def test_the_double_s_detections_are_onnx_runtime_s_through_nhwc(monkeypatch, tmp_path: Path) -> None:
    lite = rknn_double.install(monkeypatch, ROCK5B)
    model = double_rknn(DEMO, tmp_path)
    frames = [SyntheticScene(seed=7, width=640, height=480).render(i)[0] for i in range(0, 40, 8)]
    with OnnxRuntimeBackend(DEMO) as ort_rt, load_runtime("rknn", model, RKNNConfig(core_mask="0_1_2")) as rknn_rt:
        assert rknn_rt.device == "RK3588 NPU"
        assert rknn_rt.metadata.names == {0: "circle", 1: "square", 2: "triangle"}
        found = 0
        for frame in frames:
            want, got = Detector(ort_rt).detect(frame), Detector(rknn_rt).detect(frame)
            found += len(want)
            assert detection_agreement(got, want) == 1.0 and len(got) == len(want)
            np.testing.assert_allclose(got.confidence, want.confidence, atol=1e-5)
    assert found > 10
    assert ("init_runtime", {"core_mask": lite.NPU_CORE_0_1_2}) in lite.calls
    inferences = [args for name, args in lite.calls if name == "inference"]
    assert inferences and all(a == {"data_format": "nhwc", "shapes": [(1, 320, 320, 3)]} for a in inferences)
    assert lite.calls[-1] == ("release", {}), "closing the runtime releases the context"


def test_a_single_core_soc_gets_no_core_mask(monkeypatch, tmp_path: Path) -> None:
    lite = rknn_double.install(monkeypatch, _board(tmp_path, "radxa,rock-3a", "rockchip,rk3568"))
    model = double_rknn(DEMO, tmp_path, platform="rk3568")
    with load_runtime("rknn", model, RKNNConfig(core_mask="0"), warmup=True) as runtime:
        assert runtime.device == "RK3568 NPU"
    assert ("init_runtime", {"core_mask": lite.NPU_CORE_AUTO}) in lite.calls


def test_a_model_for_another_soc_is_a_target_mismatch_before_rknnlite_opens_it(monkeypatch, tmp_path: Path) -> None:
    lite = rknn_double.install(monkeypatch, ROCK5B)
    model = double_rknn(DEMO, tmp_path, platform="rk3566")
    with pytest.raises(TargetMismatch, match=r"TARGET_MISMATCH: demo_detector.rknn was converted for rk3566 .* rk3588"):
        load_runtime("rknn", model)
    assert not lite.calls, "refused before load_rknn"
    row = BundleModel(model, "rknn", "int8", "0" * 64)
    (found,) = candidates(RKNNConfig(), row, RuntimeInfo("rknn", True, "2.3.2", ("RK3588 NPU",)), False)
    assert found.unavailable is not None and "TARGET_MISMATCH" in found.unavailable
    # the matrix's row on a machine without rknnlite names the mismatch, not the missing library
    (missing,) = candidates(RKNNConfig(), row, RuntimeInfo("rknn", False, reason="no rknnlite"), False)
    assert missing.unavailable is not None and missing.unavailable.startswith("TARGET_MISMATCH")


def test_a_failed_init_runtime_is_a_model_load_error(monkeypatch, tmp_path: Path) -> None:
    """The record says rk3588 but the file is for another platform: RKNNLite's -1 is reported."""
    rknn_double.install(monkeypatch, ROCK5B)
    model = double_rknn(DEMO, tmp_path, platform="rk3566")
    record = RKNNRecord.read(model).to_json().replace(b'"rk3566"', b'"rk3588"')
    model.with_name(model.name + ".json").write_bytes(record)
    with pytest.raises(ModelLoadError, match="init_runtime failed"):
        load_runtime("rknn", model)


def test_a_model_without_its_record_is_refused(monkeypatch, tmp_path: Path) -> None:
    rknn_double.install(monkeypatch, ROCK5B)
    model = double_rknn(DEMO, tmp_path)
    model.with_name(model.name + ".json").unlink()
    with pytest.raises(ModelLoadError, match="needs its record"):
        load_runtime("rknn", model)


def test_an_rknnlite_that_does_not_import_disables_this_backend_only(monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "rknnlite", None)  # what a missing install looks like to import
    monkeypatch.setitem(sys.modules, "rknnlite.api", None)
    info = availability()
    assert not info.available and info.reason is not None and info.reason.startswith("rknnlite does not import")
    with caplog.at_level(logging.INFO, "runtimes.registry"):
        found = available_runtimes(["onnxruntime", "rknn"], isolated=False)
    assert found["onnxruntime"].available and not found["rknn"].available
    assert [r.message for r in caplog.records].count(f"runtime rknn unavailable: {info.reason}") == 1
    with pytest.raises(RuntimeUnavailable, match="rknnlite does not import"):
        load_runtime("rknn", Path(__file__))


def test_rknnlite_on_a_board_without_an_npu_is_unavailable(monkeypatch, tmp_path: Path) -> None:
    rknn_double.install(monkeypatch, FAKES / "rpi5" / "proc" / "device-tree" / "model")
    info = availability()
    assert not info.available and "no RK3588" in (info.reason or "")
