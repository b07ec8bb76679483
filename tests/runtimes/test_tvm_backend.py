"""`runtimes.tvm_backend`: targets parsed and checked, the same detections as ONNX Runtime (the
demo detector on synthetic scenes; the real COCO model on photos), the compiled-module cache and
its key, a module refused without ``allow_compiled`` and one for another CPU or TVM release
refused with ``TARGET_MISMATCH``. Tests that compile need tvm (`testkit.tvm_modules.needs_tvm`)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.tvm_modules import PI5_TARGET, fake_module, needs_tvm, pi5_module

from pipelines.decoding.detector import Detector
from pipelines.measure.parity import detection_agreement
from pipelines.sources.synthetic import SyntheticScene
from runtimes.base import BundleModel, LoadOptions, ModelLoadError, RuntimeInfo, RuntimeUnavailable
from runtimes.ort_backend import OnnxRuntimeBackend
from runtimes.registry import available_runtimes, load_runtime
from runtimes.tvm_backend import (
    ModuleRecord,
    TargetMismatch,
    availability,
    cache_entries,
    cache_key,
    candidates,
    load,
    parse_target,
    target_arch,
    user_cache,
)
from runtimes.tvm_settings import TVMConfig, with_state_dir

DEMO = DEMO_MODELS / "demo_detector.onnx"


@pytest.fixture(scope="module")
def pi5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo detector compiled for the Pi 5's cortex-a76 (cross-linked), once."""
    return pi5_module(DEMO, tmp_path_factory.mktemp("pi5"))


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("llvm", {"kind": "llvm"}),
        (PI5_TARGET, {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a76"}),
        ("llvm -mattr=+neon,+dotprod", {"kind": "llvm", "mattr": ["+neon", "+dotprod"]}),
        ('{"kind": "llvm", "mcpu": "znver4"}', {"kind": "llvm", "mcpu": "znver4"}),
    ],
)
def test_targets_parse_from_both_forms(text: str, want: dict[str, object]) -> None:
    assert parse_target(text) == want


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "a kind first"),
        ("-mcpu=x", "a kind first"),
        ("llvm mcpu", "not an option"),
        ('{"mcpu": "x"}', "with a kind"),
    ],
)
def test_malformed_targets_are_refused(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_target(text)


def test_the_arch_is_the_triple_s_first_part() -> None:
    assert target_arch({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}) == "aarch64"
    assert target_arch({"kind": "llvm", "mtriple": "x86_64-pc-linux-gnu"}) == "x86_64"
    assert with_state_dir(TVMConfig(), Path("/s")).cache_dir == Path("/s/tvm")
    assert not TVMConfig().allow_compiled, "native code is off by default"


def test_a_tvm_that_does_not_import_disables_this_backend_only(monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "tvm", None)  # what a missing or broken install looks like to import
    info = availability()
    assert not info.available and info.reason is not None and info.reason.startswith("tvm does not import")
    with caplog.at_level(logging.INFO, "runtimes.registry"):
        found = available_runtimes(["onnxruntime", "tvm"], isolated=False)
    assert found["onnxruntime"].available and not found["tvm"].available
    assert [r.message for r in caplog.records].count(f"runtime tvm unavailable: {info.reason}") == 1
    with pytest.raises(RuntimeUnavailable, match="tvm does not import"):
        load_runtime("tvm", DEMO)


def test_a_command_line_caches_in_the_user_s_cache() -> None:
    assert user_cache({"XDG_CACHE_HOME": "/c"}) == Path("/c/edge-agent/tvm")
    assert user_cache({}) == Path.home() / ".cache" / "edge-agent" / "tvm"


@pytest.mark.tvm
def test_same_detections_as_onnx_runtime_on_the_demo_detector(tmp_path: Path) -> None:
    needs_tvm()
    frames = [SyntheticScene(seed=7, width=640, height=480).render(i)[0] for i in range(0, 40, 8)]
    with OnnxRuntimeBackend(DEMO) as ort_rt, load_runtime("tvm", DEMO, TVMConfig(cache_dir=tmp_path)) as tvm_rt:
        assert tvm_rt.inputs[0].shape == (1, 3, 320, 320), "the dynamic batch fixed at 1"
        assert tvm_rt.metadata.names == {0: "circle", 1: "square", 2: "triangle"}
        ort_det, tvm_det = Detector(ort_rt), Detector(tvm_rt)
        counts = 0
        for frame in frames:
            want, got = ort_det.detect(frame), tvm_det.detect(frame)
            counts += len(want)
            assert detection_agreement(got, want) == 1.0 and len(got) == len(want)
            np.testing.assert_allclose(got.confidence, want.confidence, atol=1e-4)
            np.testing.assert_allclose(got.xyxy, want.xyxy, atol=0.05)
    assert counts > 10


@pytest.mark.slow
@pytest.mark.models
@pytest.mark.tvm
def test_same_detections_as_onnx_runtime_on_the_coco_model(shared_models: Path, photos, tmp_path: Path) -> None:
    """The FP32 COCO model (YOLOX nano): the same boxes, confidences to float error."""
    import cv2

    needs_tvm()
    model, found = shared_models / "yolox_nano_416.onnx", 0
    with OnnxRuntimeBackend(model) as ort_rt, load_runtime("tvm", model, TVMConfig(cache_dir=tmp_path)) as tvm_rt:
        for name in ("astronaut", "chelsea", "coffee"):
            frame = cv2.imread(str(photos[name]))
            want, got = Detector(ort_rt).detect(frame), Detector(tvm_rt).detect(frame)
            found += len(want)
            assert detection_agreement(got, want) == 1.0 and len(got) == len(want), name
            np.testing.assert_array_equal(got.class_id, want.class_id)
            np.testing.assert_allclose(got.confidence, want.confidence, atol=1e-4)
    assert found >= 3


@pytest.mark.models
@pytest.mark.tvm
def test_a_dynamically_quantized_model_is_refused_naming_the_operator(shared_models: Path, tmp_path: Path) -> None:
    """TVM 0.27's ONNX frontend has no ConvInteger (ONNX Runtime's dynamic quantization, the
    shared YOLOv8n int8): refused with the operator named, never a crash."""
    needs_tvm()
    with pytest.raises(ModelLoadError, match=r"not supported .*ConvInteger"):
        load(shared_models / "yolov8n_int8_640.onnx", TVMConfig(cache_dir=tmp_path), LoadOptions(warmup=False))
    assert not list(tmp_path.glob("*.so")), "nothing cached"


@pytest.mark.tvm
def test_the_compiled_module_is_cached_by_model_target_and_version(tmp_path: Path, caplog) -> None:
    needs_tvm()
    config = TVMConfig(cache_dir=tmp_path)
    with load(DEMO, config, LoadOptions(warmup=False)):
        pass
    (module,) = tmp_path.glob("*.so")
    record = ModuleRecord.read(module)
    assert module.stem == cache_key(record.model_sha256, record.target, record.tvm_version)
    assert [e.files for e in cache_entries(tmp_path)] == [(module, module.with_name(module.name + ".json"))]
    stamp = module.stat().st_mtime_ns
    with caplog.at_level(logging.INFO, "runtimes.tvm_backend"), load(DEMO, config, LoadOptions(warmup=False)) as again:
        assert again.metadata.names == {0: "circle", 1: "square", 2: "triangle"}, "the record keeps the metadata"
    assert module.stat().st_mtime_ns == stamp and "loaded the cached module" in caplog.text
    # another target or TVM release is another module
    assert cache_key(record.model_sha256, {**record.target, "mcpu": "x"}, record.tvm_version) != module.stem
    assert cache_key(record.model_sha256, record.target, "0.28.0") != module.stem


def test_a_shipped_module_is_refused_before_anything_is_opened(tmp_path: Path) -> None:
    """Without ``allow_compiled`` a module is refused whether or not tvm is here; allowed, one
    for another CPU is refused before its library is opened (it is junk here)."""
    module = fake_module(DEMO, tmp_path, arch="aarch64")
    with pytest.raises(ModelLoadError, match=r"demo_detector\.so is a compiled TVM module .*allow_compiled"):
        load_runtime("tvm", module, TVMConfig())
    needs_tvm()
    with pytest.raises(TargetMismatch, match="compiled for aarch64"):
        load_runtime("tvm", module, TVMConfig(allow_compiled=True))


@pytest.mark.tvm
def test_a_compiled_module_is_refused_unless_allowed(tmp_path: Path) -> None:
    needs_tvm()
    with load(DEMO, TVMConfig(cache_dir=tmp_path), LoadOptions(warmup=False)):
        pass
    (module,) = tmp_path.glob("*.so")
    with pytest.raises(ModelLoadError, match="allow_compiled"):
        load(module, TVMConfig(), LoadOptions(warmup=False))
    info = RuntimeInfo(name="tvm", available=True, version=ModuleRecord.read(module).tvm_version)
    (row,) = candidates(TVMConfig(), BundleModel(module, "tvm", "fp32", "0" * 64), info, False)
    assert row.unavailable is not None and "allow_compiled" in row.unavailable
    with load(module, TVMConfig(allow_compiled=True), LoadOptions(warmup=False)) as runtime:
        (out,) = runtime.infer([np.zeros((1, 3, 320, 320), np.float32)])
        assert out.shape == (1, 7, 2100)


@pytest.mark.tvm
def test_a_module_for_another_cpu_is_a_target_mismatch(pi5: Path) -> None:
    record = ModuleRecord.read(pi5)
    assert (record.arch, record.target["mcpu"]) == ("aarch64", "cortex-a76")
    with pytest.raises(TargetMismatch, match=r"TARGET_MISMATCH: .*compiled for aarch64 .*this device is x86_64"):
        load(pi5, TVMConfig(allow_compiled=True), LoadOptions(warmup=False))
    info = RuntimeInfo(name="tvm", available=True, version=record.tvm_version)
    (row,) = candidates(TVMConfig(allow_compiled=True), BundleModel(pi5, "tvm", "fp32", "0" * 64), info, False)
    assert row.unavailable is not None and row.unavailable.startswith("TARGET_MISMATCH")


@pytest.mark.tvm
def test_a_module_of_another_tvm_release_is_a_target_mismatch(tmp_path: Path) -> None:
    needs_tvm()
    with load(DEMO, TVMConfig(cache_dir=tmp_path), LoadOptions(warmup=False)):
        pass
    (module,) = tmp_path.glob("*.so")
    path = module.with_name(module.name + ".json")
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "tvm_version": "0.26.0"}))
    with pytest.raises(TargetMismatch, match=r"compiled with TVM 0\.26\.0, this device runs TVM 0\.27"):
        load(module, TVMConfig(allow_compiled=True), LoadOptions(warmup=False))


def test_a_module_without_its_record_is_refused(tmp_path: Path) -> None:
    module = tmp_path / "m.so"
    module.write_bytes(b"\x7fELF")
    with pytest.raises(ModelLoadError, match=r"needs its record m\.so\.json"):
        load(module, TVMConfig(allow_compiled=True), LoadOptions(warmup=False))
    (tmp_path / "m.so.json").write_bytes(b"{" * (1 << 21))
    with pytest.raises(ModelLoadError, match="larger than"):
        load(module, TVMConfig(allow_compiled=True), LoadOptions(warmup=False))
