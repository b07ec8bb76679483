"""`runtimes.tensorrt_engines`: prebuilt engines only on an exact match, failed builds recorded."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from testkit import DEMO_MODELS
from testkit.trt_double import TrtDouble

from runtimes.engine_cache import EngineCache, EngineKey
from runtimes.tensorrt_backend import EngineNotReady, TensorRTConfig, open_engine
from runtimes.tensorrt_build import EngineBuildError
from runtimes.tensorrt_engines import Prebuilt, prepare_engine

FIXED = DEMO_MODELS / "demo_detector.onnx"  # dynamic batch only, 320x320


def config(tmp_path: Path, **changes: object) -> TensorRTConfig:
    return TensorRTConfig(engine_cache_dir=tmp_path / "engines", **changes)


def test_prebuilt_engines_are_used_only_on_an_exact_match(
    trt_double: TrtDouble, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # fails on: an engine for another GPU or TensorRT used, or passed over without a word naming both
    elsewhere = config(tmp_path / "operator")
    shipped = prepare_engine(FIXED, elsewhere)
    other_gpu = EngineKey(**{**shipped.key.to_json(), "gpu_name": "Xavier", "compute_capability": (7, 2)})
    settings = config(tmp_path / "device")
    with caplog.at_level(logging.INFO, logger="runtimes.tensorrt_engines"):
        wrong = prepare_engine(FIXED, settings, prebuilt=[Prebuilt(other_gpu, shipped.path)])
    assert wrong.how == "built"
    (said,) = [r.getMessage() for r in caplog.records if "TARGET_MISMATCH" in r.getMessage()]
    assert f"built for {other_gpu.describe()}, this device is {wrong.key.describe()}" in said, said
    settings = config(tmp_path / "device2")
    right = prepare_engine(
        FIXED, settings, prebuilt=[Prebuilt(other_gpu, shipped.path), Prebuilt(shipped.key, shipped.path)]
    )
    assert right.how == "prebuilt" and right.record.origin == "prebuilt"
    assert right.path.read_bytes() == shipped.path.read_bytes()


def test_a_failed_build_is_recorded_and_not_retried_unless_forced(trt_double: TrtDouble, tmp_path: Path) -> None:
    settings = config(tmp_path)
    trt_double.internals.UNSUPPORTED_OPS.add("Conv")
    with pytest.raises(EngineBuildError):
        prepare_engine(FIXED, settings)
    with pytest.raises(EngineNotReady, match="its last build failed: TensorRT cannot parse") as caught:
        open_engine(FIXED, settings)
    assert caught.value.failure is not None
    trt_double.internals.UNSUPPORTED_OPS.discard("Conv")
    builds = len(trt_double.internals.builds)
    with pytest.raises(EngineBuildError, match=r"the last build of this engine failed .*--force builds it again"):
        prepare_engine(FIXED, settings)
    assert len(trt_double.internals.builds) == builds
    assert prepare_engine(FIXED, settings, force=True).how == "built"
    assert EngineCache(settings.engine_cache_dir).failure(caught.value.key) is None


def test_a_prebuilt_engine_whose_header_names_another_tensorrt_is_not_used(
    trt_double: TrtDouble, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tags say this device's TensorRT, the plan's header (bytes 24-26) says 10.12.0: the
    engine is refused before TensorRT deserializes it, and built here instead."""
    shipped = prepare_engine(FIXED, config(tmp_path / "operator"))
    plan = bytearray(shipped.path.read_bytes())
    assert tuple(plan[24:27]) == tuple(int(p) for p in shipped.key.tensorrt_version.split(".")[:3])
    plan[25] -= 1
    forged = tmp_path / "forged.engine"
    forged.write_bytes(bytes(plan))
    with caplog.at_level(logging.WARNING):
        used = prepare_engine(FIXED, config(tmp_path / "device"), prebuilt=[Prebuilt(shipped.key, forged)])
    assert used.how == "built"
    assert any("was built by TensorRT 10.12.0, not" in r.getMessage() for r in caplog.records), caplog.text
    truncated = tmp_path / "short.engine"
    truncated.write_bytes(bytes(plan[:20]))
    assert prepare_engine(FIXED, config(tmp_path / "d3"), prebuilt=[Prebuilt(shipped.key, truncated)]).how == "built"
