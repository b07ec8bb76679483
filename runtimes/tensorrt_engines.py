"""Getting a TensorRT engine into the cache: a cached one, a prebuilt one, or a fresh build.

`prepare_engine` is what ``edge-agent engine build`` and the daemon's background builder run.
In order: an engine cached for exactly this key is kept; else a prebuilt engine the bundle
carries is used when its tags (GPU, compute capability, TensorRT version, precision, profile,
ONNX sha256) equal this device's key exactly and the TensorRT version in the plan's own header
matches its tags (`plan_version`); else the engine is built (`runtimes.tensorrt_build`)
with the cache's timing and calibration caches. A failed build (or an engine that failed its
parity check) is recorded in the cache with its reason and not built again until the key
changes (e.g. a new TensorRT version) or `force` asks for it.

Runs in the caller's thread (seconds to minutes); progress and cancellation as in
`build_engine`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runtimes.base import Prebuilt as Prebuilt  # re-exported: what a bundle ships
from runtimes.base import RuntimeUnavailable
from runtimes.cuda_memory import DeviceMemory, open_device_memory
from runtimes.engine_cache import EngineCache, EngineKey, EngineRecord
from runtimes.tensorrt_build import (
    BuildCancelled,
    BuildOptions,
    BuildProgress,
    CalibrationBatches,
    EngineBuildError,
    build_engine,
    require_tensorrt,
)
from runtimes.tensorrt_settings import TensorRTConfig, engine_cache, engine_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """An engine in the cache: its key, record, file, and how it got there ("cache", "prebuilt",
    "built")."""

    key: EngineKey
    record: EngineRecord
    path: Path
    how: str


def read_onnx_metadata(onnx_path: Path) -> dict[str, str]:
    """The ONNX file's metadata properties (Ultralytics' names, imgsz, stride), read once with
    ONNX Runtime so that serving the engine never reopens the ONNX model; empty when unreadable."""
    try:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        return {str(k): str(v) for k, v in session.get_modelmeta().custom_metadata_map.items()}
    except Exception as exc:  # metadata is a convenience: the manifest carries labels and decoder
        log.warning("cannot read the metadata of %s: %s", onnx_path.name, exc)
        return {}


#: where a serialized engine (a plan, TensorRT 8.6 and later) carries the version of the TensorRT
#: that built it: major, minor, patch at bytes 24, 25, 26 (NVIDIA/TensorRT#3073)
PLAN_VERSION_AT = slice(24, 27)


def plan_version(plan: bytes) -> tuple[int, int, int] | None:
    """The TensorRT version (major, minor, patch) in a plan's header; None when it is too short."""
    version = tuple(plan[PLAN_VERSION_AT])
    return (version[0], version[1], version[2]) if len(version) == 3 else None


def _prebuilt_plan(candidate: Prebuilt, key: EngineKey) -> bytes | None:
    """The bytes of a prebuilt engine whose tags match this device (`key`), or None (with a
    warning) when its header names another TensorRT than its tags: such an engine is never
    deserialized."""
    plan = candidate.path.read_bytes()
    wanted = tuple(int(part) for part in key.tensorrt_version.split(".")[:3])
    found = plan_version(plan)
    if found != wanted:
        built = ".".join(map(str, found)) if found else "an unreadable version"
        log.warning(
            "tensorrt: the bundle's prebuilt engine %s was built by TensorRT %s, not %s as its tags say; "
            "building the engine here instead",
            candidate.path.name,
            built,
            key.tensorrt_version,
        )
        return None
    return plan


def prepare_engine(
    onnx_path: Path,
    config: TensorRTConfig,
    *,
    sha256: str | None = None,
    calibration: CalibrationBatches | None = None,
    prebuilt: Sequence[Prebuilt] = (),
    on_progress: Callable[[BuildProgress], None] = lambda progress: None,
    cancel: threading.Event | None = None,
    force: bool = False,
    memory: DeviceMemory | None = None,
) -> Prepared:
    """Make sure the engine `config` asks for from `onnx_path` is in the cache; see the module
    docstring. Raises `EngineBuildError` (recorded as the key's failure unless cancelled) and
    `RuntimeUnavailable` when TensorRT or a CUDA library is missing."""
    version = require_tensorrt()
    own_memory = memory is None
    memory = memory or open_device_memory()
    try:
        key = engine_key(onnx_path, config, memory.info(), version, sha256)
        cache = engine_cache(config)
        if not force and (failure := cache.failure(key)) is not None:
            raise EngineBuildError(f"the last build of this engine failed ({failure}); --force builds it again")
        if not force and (record := cache.lookup(key)) is not None:
            return Prepared(key, record, cache.engine_path(key), "cache")
        for candidate in prebuilt:
            built = candidate.key  # hashable in runtimes.base; TensorRT's prebuilt engines carry an EngineKey
            same_model = isinstance(built, EngineKey) and built.onnx_sha256 == key.onnx_sha256
            if same_model and isinstance(built, EngineKey) and built.precision == key.precision and built != key:
                log.info(
                    "tensorrt: the bundle's prebuilt engine %s is passed over: TARGET_MISMATCH: built for %s, "
                    "this device is %s; building it here",
                    candidate.path.name,
                    built.describe(),
                    key.describe(),
                )
            if candidate.key == key and (plan := _prebuilt_plan(candidate, key)) is not None:
                record = EngineRecord(key, read_onnx_metadata(onnx_path), key.precision, origin="prebuilt")
                path = cache.store(record, plan)
                log.info("tensorrt: using the bundle's prebuilt engine %s (%s)", candidate.path.name, key.describe())
                return Prepared(key, record, path, "prebuilt")
        return _build(onnx_path, config, key, cache, calibration, on_progress, cancel, memory)
    finally:
        if own_memory:
            memory.close()


def _build(
    onnx_path: Path,
    config: TensorRTConfig,
    key: EngineKey,
    cache: EngineCache,
    calibration: CalibrationBatches | None,
    on_progress: Callable[[BuildProgress], None],
    cancel: threading.Event | None,
    memory: DeviceMemory,
) -> Prepared:
    options = BuildOptions(
        precision=key.precision,
        workspace_mb=config.workspace_mb,
        profile=config.profile.to_profile() if config.profile is not None else None,
        timing_cache=cache.timing_cache(key) if config.timing_cache else None,
        calibration=calibration,
        calibration_cache=cache.calibration_cache(key),
    )
    log.info("tensorrt: building %s (%s)", onnx_path.name, key.describe())
    try:
        built = build_engine(onnx_path, options, on_progress=on_progress, cancel=cancel, memory=memory)
    except BuildCancelled:
        raise
    except (EngineBuildError, RuntimeUnavailable) as exc:
        cache.record_failure(key, str(exc))
        raise
    record = EngineRecord(
        key,
        read_onnx_metadata(onnx_path),
        built.precision,
        built.int8_source,
        built.seconds,
        origin="built",
        notes=built.notes,
    )
    path = cache.store(record, built.data)
    return Prepared(key, record, path, "built")
