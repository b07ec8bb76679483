"""`runtimes.tensorrt_settings` and TensorRT's registry entry: what autotune tries of an ONNX artifact
(an engine per precision, INT8 only where it can be built), the manifest's profile over the
device's, the settings' engine cache and its bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import DEMO_MODELS

from runtimes.base import BundleHints, BundleModel, RuntimeInfo, RuntimeUnavailable
from runtimes.registry import RuntimeSettings, tune_candidates
from runtimes.tensorrt_settings import ProfileSettings, TensorRTConfig, engine_cache, engine_precision

GPU = RuntimeInfo("tensorrt", True, "10.13.0.35", ("Orin (sm 8.7)",))


def _model(name: str, calibration: bool = False) -> BundleModel:
    batches = (lambda: iter(())) if calibration else None
    return BundleModel(DEMO_MODELS / name, "onnx", "fp32", "0" * 64, batches)


def _rows(model: BundleModel, info: RuntimeInfo = GPU) -> list[tuple[str, str, str | None]]:
    found = tune_candidates("tensorrt", TensorRTConfig(), model, info, variants=True)
    assert all(isinstance(c.config, TensorRTConfig) and c.config.precision == c.precision for c in found)
    assert all((c.workers, c.threads) == (1, None) for c in found), "one execution context, one call"
    return [(c.device, c.precision, c.unavailable) for c in found]


def test_an_engine_per_precision_int8_where_it_can_be_built() -> None:
    why = "int8 needs a Q/DQ model or calibration images in the bundle"
    gpu = "Orin (sm 8.7)"
    assert _rows(_model("demo_detector.onnx")) == [(gpu, "fp32", None), (gpu, "fp16", None), (gpu, "int8", why)]
    calibrated = _rows(_model("demo_detector.onnx", calibration=True))
    assert calibrated == [(gpu, "fp32", None), (gpu, "fp16", None), (gpu, "int8", None)]
    assert engine_precision(DEMO_MODELS / "demo_detector_int8_qdq.onnx", "fp16") == "int8"
    assert _rows(_model("demo_detector_int8_qdq.onnx")) == [(gpu, "int8", None)], "a Q/DQ model builds int8 only"
    missing = RuntimeInfo("tensorrt", False, reason="no TensorRT here")
    assert {row[2] for row in _rows(_model("demo_detector.onnx"), missing)} == {"no TensorRT here"}


def test_the_manifest_s_profile_wins_over_the_device_s() -> None:
    device = ProfileSettings(min=(1, 3, 320, 320), opt=(1, 3, 320, 320), max=(1, 3, 320, 320))
    settings = RuntimeSettings(tensorrt=TensorRTConfig(profile=device))
    shapes = ((1, 3, 320, 320), (1, 3, 640, 640), (4, 3, 640, 640))
    bundle = settings.for_bundle(BundleHints(shapes)).of(TensorRTConfig).profile
    assert bundle is not None and (bundle.min, bundle.opt, bundle.max) == shapes
    assert settings.for_bundle(BundleHints()).of(TensorRTConfig).profile == device


def test_the_engine_cache_is_where_the_state_dir_puts_it_within_its_bound(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable, match="engine_cache_dir is not set"):
        engine_cache(TensorRTConfig())
    config = RuntimeSettings().with_state_dir(tmp_path).of(TensorRTConfig)
    assert engine_cache(config).folder == tmp_path / "engines" and config.engine_cache_max_mb == 1024
