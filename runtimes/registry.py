"""Runtime names -> backends, with guarded imports.

A backend whose library is missing is reported unavailable with the reason; asking to load
it raises `RuntimeUnavailable`, it never crashes the process at import time.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated

from pydantic import Field

from runtimes import litert_backend, ort_backend
from runtimes.base import RUNTIME_NAMES, Runtime, RuntimeInfo, RuntimeName, RuntimeUnavailable
from runtimes.litert_backend import LiteRTConfig
from runtimes.ort_backend import OnnxRuntimeConfig

log = logging.getLogger(__name__)

#: Backend settings, discriminated by ``type`` (a wrong name or field fails at load).
RuntimeConfig = Annotated[OnnxRuntimeConfig | LiteRTConfig, Field(discriminator="type")]


def _tensorrt_availability() -> RuntimeInfo:
    """TensorRT's native backend is not part of this release; say so, with the library version."""
    try:
        trt = importlib.import_module("tensorrt")
        version = str(getattr(trt, "__version__", "unknown"))
    except ImportError:
        return RuntimeInfo(
            name="tensorrt", available=False, reason="tensorrt (JetPack / TensorRT wheel) is not installed"
        )
    return RuntimeInfo(
        name="tensorrt",
        available=False,
        version=version,
        reason="this edge-agent release has no native TensorRT backend yet; "
        "ONNX Runtime's TensorRT execution provider is used where installed",
    )


_AVAILABILITY: dict[RuntimeName, Callable[[], RuntimeInfo]] = {
    "tensorrt": _tensorrt_availability,
    "onnxruntime": ort_backend.availability,
    "litert": litert_backend.availability,
}


def available_runtimes(names: Iterable[RuntimeName] = RUNTIME_NAMES) -> dict[RuntimeName, RuntimeInfo]:
    """Probe the named backends' libraries (importing each costs memory, so callers that know
    the artifact format probe only the runtimes that load it); unavailable ones carry the reason."""
    infos = {name: _AVAILABILITY[name]() for name in names}
    for info in infos.values():
        if not info.available:
            log.info("runtime %s unavailable: %s", info.name, info.reason)
    return infos


def load_runtime(
    name: RuntimeName,
    model_path: Path,
    config: OnnxRuntimeConfig | LiteRTConfig | None = None,
    warmup: bool = True,
    workers: int = 1,
) -> Runtime:
    """Load `model_path` with the named backend, warmed up unless `warmup` is false (one-shot
    commands skip it). Raises `RuntimeUnavailable` when the backend cannot run here and
    `ModelLoadError` when it refuses the model.

    `workers` is how many calls the caller will have in flight at once; without a `config`,
    ONNX Runtime then gives each call an equal share of the cores (other backends ignore it:
    they serve one call at a time)."""
    if name == "onnxruntime":
        if config is not None and not isinstance(config, OnnxRuntimeConfig):
            raise TypeError(f"onnxruntime takes an OnnxRuntimeConfig, got {type(config).__name__}")
        if config is None and workers > 1:
            config = OnnxRuntimeConfig(intra_op_threads=max(1, (os.cpu_count() or 1) // workers))
        return ort_backend.OnnxRuntimeBackend(model_path, config, warmup)
    if name == "litert":
        if config is not None and not isinstance(config, LiteRTConfig):
            raise TypeError(f"litert takes a LiteRTConfig, got {type(config).__name__}")
        return litert_backend.LiteRTBackend(model_path, config, warmup)
    if name == "tensorrt":
        raise RuntimeUnavailable(_tensorrt_availability().reason or "tensorrt is unavailable")
    raise RuntimeUnavailable(f"unknown runtime {name!r}; known: {', '.join(RUNTIME_NAMES)}")
