"""`runtimes.engine_cache`: keys, lookups, corrupt entries, a new TensorRT version, failures with their key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.trt_double import TrtDouble

from runtimes.base import CacheEntry
from runtimes.engine_cache import EngineCache, EngineKey, cache_entries
from runtimes.tensorrt_backend import EngineNotReady, TensorRTConfig, open_engine
from runtimes.tensorrt_engines import prepare_engine

FIXED = DEMO_MODELS / "demo_detector.onnx"  # dynamic batch only, 320x320


def config(tmp_path: Path, **changes: object) -> TensorRTConfig:
    return TensorRTConfig(engine_cache_dir=tmp_path / "engines", **changes)


def frame(shape: tuple[int, ...] = (1, 3, 320, 320), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


def test_cache_key_fields_and_lookup(trt_double: TrtDouble, tmp_path: Path) -> None:
    settings = config(tmp_path)
    with pytest.raises(EngineNotReady, match="it has not been built yet") as caught:
        open_engine(FIXED, settings)
    key = caught.value.key
    assert key.gpu_name == "Orin (test double)" and key.compute_capability == (8, 7)
    assert key.tensorrt_version == "10.13.0.35" and key.precision == "fp16" and key.profile is None
    digests = {key.digest}
    for change in [
        {"onnx_sha256": "0" * 64},
        {"tensorrt_version": "10.3.0"},
        {"gpu_name": "Xavier"},
        {"compute_capability": (7, 2)},
        {"precision": "fp32"},
        {"profile": ((1, 3, 320, 320),) * 3},
    ]:
        digests.add(EngineKey(**{**key.to_json(), "compute_capability": key.compute_capability, **change}).digest)
    assert len(digests) == 7, "every field of the key changes the file name"
    prepared = prepare_engine(FIXED, settings)
    assert prepared.how == "built" and prepared.key == key and prepared.path.name == f"{key.digest}.engine"
    assert prepare_engine(FIXED, settings).how == "cache"
    assert EngineKey.from_json(key.to_json()) == key


def test_a_corrupt_cache_entry_is_discarded_and_rebuilt(trt_double: TrtDouble, tmp_path: Path) -> None:
    settings = config(tmp_path)
    prepared = prepare_engine(FIXED, settings)
    prepared.path.write_bytes(prepared.path.read_bytes()[:100])  # a torn write, a bad sector
    with pytest.raises(EngineNotReady, match=r"cannot deserialize .* discarded and will be built again"):
        open_engine(FIXED, settings)
    assert not prepared.path.exists()
    assert prepare_engine(FIXED, settings).how == "built"
    with open_engine(FIXED, settings) as runtime:
        assert runtime.infer([frame()])[0].shape == (1, 7, 2100)


def test_a_new_tensorrt_version_gets_its_own_engine(trt_double: TrtDouble, tmp_path: Path) -> None:
    settings = config(tmp_path)
    old = prepare_engine(FIXED, settings)
    trt_double.internals.VERSION = trt_double.trt.__version__ = "10.14.1.48"  # JetPack upgraded TensorRT
    try:
        with pytest.raises(EngineNotReady, match=r"TensorRT 10\.14\.1\.48.*it has not been built yet"):
            open_engine(FIXED, settings)
        new = prepare_engine(FIXED, settings)
        assert new.how == "built" and new.path != old.path and old.path.exists(), "the old one stays for a downgrade"
        # an engine of the old version under the new key (a copied cache) fails to deserialize: rebuilt
        new.path.write_bytes(old.path.read_bytes())
        with pytest.raises(EngineNotReady, match="not compatible with this version of TensorRT"):
            open_engine(FIXED, settings)
        assert prepare_engine(FIXED, settings).how == "built"
    finally:
        trt_double.internals.VERSION = trt_double.trt.__version__ = "10.13.0.35"


def test_a_failure_is_recorded_with_its_key_and_an_older_agent_s_still_reads(tmp_path: Path) -> None:
    """The key in the failure is what the store's gc prunes it by (`cache_entries`)."""
    cache = EngineCache(tmp_path)
    key = EngineKey("ab" * 32, "10.13.0.35", "Orin", (8, 7), "int8")
    cache.record_failure(key, "int8 needs calibration images")
    assert cache.failure(key) == "int8 needs calibration images"
    assert cache_entries(tmp_path) == [CacheEntry("ab" * 32, (tmp_path / f"{key.digest}.failed",))]
    (tmp_path / f"{key.digest}.failed").write_text("TensorRT cannot parse the model\n")  # an older agent's
    assert cache.failure(key) == "TensorRT cannot parse the model"
    assert cache_entries(tmp_path) == [CacheEntry(None, (tmp_path / f"{key.digest}.failed",))]
