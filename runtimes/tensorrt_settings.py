"""TensorRT's settings (the ``runtimes.tensorrt`` section of agent.yaml), what they key (the
cache key of the engine they ask for from an ONNX model on a GPU, and the engine cache they
name), `EngineNotReady`, and TensorRT's registry entry.

Apart from `runtimes.tensorrt_backend` (serving engines) so that `runtimes.tensorrt_engines`
(building them) and the backend both import it, and light: the entry names the backend's code
with `runtimes.base.lazy`, so that importing the registry (``detect`` on ONNX Runtime) imports
neither TensorRT's code nor its engine cache's. `runtimes.tensorrt_backend` re-exports the
settings and functions here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from runtimes.base import (
    CACHE_MAX_MB,
    Backend,
    BackendConfig,
    BundleHints,
    Cache,
    Precision,
    RuntimeInfo,
    RuntimeUnavailable,
    lazy,
)
from runtimes.files import sha256_file

if TYPE_CHECKING:
    from runtimes.cuda_memory import GpuInfo
    from runtimes.engine_cache import EngineCache, EngineKey
    from runtimes.tensorrt_build import Profile

KEY = "tensorrt"
_CODE = "runtimes.tensorrt_backend"

#: the ONNX operator that makes a model explicitly quantized, Q/DQ (its engine is INT8); ONNX
#: Runtime's dynamic quantization (DynamicQuantizeLinear + ConvInteger) has none, and no importer
_QDQ_OP = b"DequantizeLinear"


class ProfileSettings(BaseModel):
    """An optimization profile for a dynamic input: smallest, tuned-for and largest shape."""

    # built when first used, as the backends' settings are (`runtimes.base.BackendConfig`)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    min: tuple[int, ...] = Field(description="Smallest input shape, e.g. [1, 3, 320, 320].")
    opt: tuple[int, ...] = Field(description="Shape the engine is tuned for, e.g. [1, 3, 640, 640].")
    max: tuple[int, ...] = Field(description="Largest input shape.")

    @model_validator(mode="after")
    def _ordered(self) -> ProfileSettings:
        self.to_profile()  # raises ValueError with the shapes
        return self

    def to_profile(self) -> Profile:
        from runtimes.tensorrt_build import Profile

        return Profile(self.min, self.opt, self.max)


class TensorRTConfig(BackendConfig):
    """Settings of the TensorRT backend."""

    type: Literal["tensorrt"] = "tensorrt"
    precision: Precision = Field(
        default="fp16",
        description="Engine precision: fp16 where the GPU has fast FP16 (else fp32); int8 needs a Q/DQ model "
        "or the bundle's calibration images. A Q/DQ model always builds int8.",
    )
    engine_cache_dir: Path | None = Field(
        default=None, description="Where built engines are cached; default: <state_dir>/engines."
    )
    workspace_mb: int = Field(default=1024, ge=16, description="Builder workspace memory-pool limit in MiB.")
    engine_cache_max_mb: int = Field(
        default=CACHE_MAX_MB,
        ge=0,
        description="The most MiB of engines the cache keeps: when the bundle store removes versions, "
        "engines of models no installed version uses are removed, then the oldest beyond this, never "
        "those of the current and previous versions.",
    )
    timing_cache: bool = Field(default=True, description="Keep TensorRT's timing cache beside the engines.")
    profile: ProfileSettings | None = Field(
        default=None,
        description="Optimization profile for a dynamic input when the bundle's manifest has no tensorrt_profile.",
    )


class EngineNotReady(RuntimeUnavailable):
    """No engine is cached for this model, GPU, TensorRT version and precision yet (or the last
    build failed: `failure` says why). `key` is what a build would produce."""

    def __init__(self, message: str, key: EngineKey, failure: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.failure = failure


def engine_precision(onnx_path: Path, requested: Precision) -> Precision:
    """The precision an engine of `onnx_path` is built in: int8 for an explicitly quantized (Q/DQ)
    model, else `requested`."""
    return "int8" if _QDQ_OP in onnx_path.read_bytes() else requested


def engine_key(
    onnx_path: Path, config: TensorRTConfig, gpu: GpuInfo, tensorrt_version: str, sha256: str | None = None
) -> EngineKey:
    """The cache key of the engine `config` asks for from `onnx_path` on `gpu`."""
    from runtimes.engine_cache import EngineKey

    profile = config.profile.to_profile() if config.profile is not None else None
    return EngineKey(
        onnx_sha256=sha256 or sha256_file(onnx_path),
        tensorrt_version=tensorrt_version,
        gpu_name=gpu.name,
        compute_capability=gpu.compute_capability,
        precision=engine_precision(onnx_path, config.precision),
        profile=None if profile is None else (profile.min, profile.opt, profile.max),
    )


def engine_cache(config: TensorRTConfig) -> EngineCache:
    """The cache `config` names; its folder must be set (the agent sets <state_dir>/engines)."""
    if config.engine_cache_dir is None:
        raise RuntimeUnavailable("runtimes.tensorrt.engine_cache_dir is not set (the agent sets <state_dir>/engines)")
    from runtimes.engine_cache import EngineCache

    return EngineCache(config.engine_cache_dir)


def with_state_dir(config: TensorRTConfig, state_dir: Path) -> TensorRTConfig:
    """The engine cache defaults to ``<state_dir>/engines``."""
    if config.engine_cache_dir is not None:
        return config
    return config.model_copy(update={"engine_cache_dir": state_dir / "engines"})


def device_label(info: RuntimeInfo) -> str:
    """TensorRT serves engines on the GPU (FP16 by default)."""
    return "GPU (FP16)"


def for_bundle(config: TensorRTConfig, hints: BundleHints) -> TensorRTConfig:
    """The manifest's optimization profile, when it has one (it wins over the device's
    `runtimes.tensorrt.profile`: the bundle knows its model)."""
    if hints.profile is None:
        return config
    smallest, opt, largest = hints.profile
    return config.model_copy(update={"profile": ProfileSettings(min=smallest, opt=opt, max=largest)})


BACKEND = Backend(
    name=KEY,
    config=TensorRTConfig,
    summary="TensorRT: precision, engine cache, workspace.",
    formats=("onnx",),
    rank={"nvidia": 10},
    libraries=("tensorrt",),
    availability=lazy(_CODE, "availability"),
    load=lazy(_CODE, "load"),
    device_label=device_label,
    with_state_dir=with_state_dir,
    for_bundle=for_bundle,
    candidates=lazy(_CODE, "candidates"),
    prepare=lazy(_CODE, "prepare"),
    caches=(
        Cache(
            "engines",
            folder=lambda config: config.engine_cache_dir,
            entries=lazy("runtimes.engine_cache", "cache_entries"),
            max_mb=lambda config: config.engine_cache_max_mb,
        ),
    ),
)
