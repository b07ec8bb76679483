"""Runtime names -> backends, with guarded imports, and the settings of each backend.

`BACKENDS` is the one table of backends: its keys are `RuntimeName`, each entry has the
backend's settings model (a ``type``-tagged pydantic model, as Frigate configures detectors)
and its availability probe. `RuntimeSettings` is the ``runtimes:`` section of agent.yaml, one
tagged section per backend. A backend whose library is missing is reported unavailable with the
reason; asking to load it raises `RuntimeUnavailable`, it never crashes the process at import.
Libraries are probed, and a model's first load checked, in a child process (`runtimes.isolation`),
so one that crashes on import or load is reported instead of taking the agent down.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from runtimes import litert_backend, ort_backend, tensorrt_backend
from runtimes.base import RUNTIME_NAMES, Runtime, RuntimeInfo, RuntimeName, RuntimeUnavailable
from runtimes.isolation import check_load_isolated, probe_isolated
from runtimes.litert_backend import LiteRTConfig
from runtimes.ort_backend import OnnxRuntimeConfig
from runtimes.tensorrt_backend import TensorRTConfig

log = logging.getLogger(__name__)

BackendConfig = OnnxRuntimeConfig | LiteRTConfig | TensorRTConfig
#: Backend settings, discriminated by ``type`` (a wrong name or field fails at load).
RuntimeConfig = Annotated[BackendConfig, Field(discriminator="type")]


@dataclass(frozen=True)
class Backend:
    """One runtime backend: its settings model and how to tell whether it runs here."""

    config: type[BackendConfig]
    availability: Callable[[], RuntimeInfo]


BACKENDS: dict[RuntimeName, Backend] = {
    "tensorrt": Backend(TensorRTConfig, tensorrt_backend.availability),
    "onnxruntime": Backend(OnnxRuntimeConfig, ort_backend.availability),
    "litert": Backend(LiteRTConfig, litert_backend.availability),
}


class RuntimeSettings(BaseModel):
    """The ``runtimes:`` section of agent.yaml: one section per backend, each optional."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    onnxruntime: OnnxRuntimeConfig = Field(
        default_factory=OnnxRuntimeConfig, description="ONNX Runtime: execution providers in order, threads, ..."
    )
    litert: LiteRTConfig = Field(default_factory=LiteRTConfig, description="LiteRT: threads, external delegate.")
    tensorrt: TensorRTConfig = Field(
        default_factory=TensorRTConfig, description="TensorRT: precision, engine cache, workspace."
    )

    def config_for(self, name: RuntimeName) -> BackendConfig:
        config: BackendConfig = getattr(self, name)
        return config


def available_runtimes(
    names: Iterable[RuntimeName] = RUNTIME_NAMES, isolated: bool = True
) -> dict[RuntimeName, RuntimeInfo]:
    """Probe the named backends' libraries, each imported in a child process once per process
    (`runtimes.isolation`: a library that crashes there is unavailable, with `crashed` set);
    unavailable ones carry the reason. `isolated=False` imports them here instead, for a
    one-shot command that loads the model in this process right after anyway."""
    if isolated:
        infos = probe_isolated(names, lambda name: BACKENDS[name].availability())
    else:
        infos = {name: BACKENDS[name].availability() for name in names}
    for info in infos.values():
        if not info.available:
            log.info("runtime %s unavailable: %s", info.name, info.reason)
    return infos


def load_runtime(
    name: RuntimeName,
    model_path: Path,
    config: BackendConfig | None = None,
    warmup: bool = True,
    workers: int = 1,
) -> Runtime:
    """Load `model_path` with the named backend, warmed up unless `warmup` is false (one-shot
    commands skip it). Raises `RuntimeUnavailable` when the backend cannot run here and
    `ModelLoadError` when it refuses the model.

    TensorRT serves only an engine already in its cache (`tensorrt_backend.open_engine`); without
    one it raises `EngineNotReady` (a `RuntimeUnavailable`) and the caller builds it.

    `workers` is how many calls the caller will have in flight at once; when the ONNX Runtime
    settings leave the thread count to it (0), each call then gets an equal share of the cores
    (other backends ignore it: they serve one call at a time)."""
    if name not in BACKENDS:
        raise RuntimeUnavailable(f"unknown runtime {name!r}; known: {', '.join(RUNTIME_NAMES)}")
    config = config if config is not None else BACKENDS[name].config()
    if not isinstance(config, BACKENDS[name].config):
        raise TypeError(f"{name} takes a {BACKENDS[name].config.__name__}, got {type(config).__name__}")
    if isinstance(config, OnnxRuntimeConfig):
        if workers > 1 and config.intra_op_threads == 0:
            config = config.model_copy(update={"intra_op_threads": max(1, (os.cpu_count() or 1) // workers)})
        return ort_backend.OnnxRuntimeBackend(model_path, config, warmup)
    if isinstance(config, LiteRTConfig):
        return litert_backend.LiteRTBackend(model_path, config, warmup)
    return tensorrt_backend.open_engine(model_path, config, warmup=warmup)


def load_runtime_checked(
    name: RuntimeName, model_path: Path, config: BackendConfig, workers: int = 1, warmup: bool = True
) -> Runtime:
    """`load_runtime` (warmed up unless `warmup` is false), once a child process has loaded
    and warmed up the same model with the same settings without dying (checked once per process
    and file version). Raises
    `runtimes.isolation.RuntimeCrashed` when that child died, else as `load_runtime`."""
    if name in BACKENDS:
        check_load_isolated(name, model_path, config.model_dump_json())
    return load_runtime(name, model_path, config, warmup=warmup, workers=workers)
