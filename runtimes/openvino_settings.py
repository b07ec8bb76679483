"""OpenVINO's settings (the ``runtimes.openvino`` section of agent.yaml) and its registry entry,
apart from `runtimes.openvino_backend` (the library's wrapper and its compiled-model cache, which
the entry names lazily): importing the registry, to validate a config or to load another
backend, imports this only. `runtimes.openvino_backend` re-exports the settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from runtimes.base import CACHE_MAX_MB, Backend, BackendConfig, Cache, lazy

KEY = "openvino"
_CODE = "runtimes.openvino_backend"

Device = Literal["CPU", "GPU", "NPU"]
Hint = Literal["auto", "latency", "throughput"]


class OpenVINOConfig(BackendConfig):
    """Settings of the OpenVINO backend."""

    type: Literal["openvino"] = "openvino"
    device: Device = Field(
        default="CPU",
        description="Device to compile for: CPU, or an Intel GPU or NPU that OpenVINO lists on this machine.",
    )
    performance_hint: Hint = Field(
        default="auto",
        description="OpenVINO's performance hint: latency (one call at a time), throughput (several "
        "calls in flight, parallel streams), or auto: latency for one worker, throughput for more.",
    )
    threads: int = Field(
        default=0, ge=0, description="CPU threads for inference (INFERENCE_NUM_THREADS); 0 = OpenVINO's default."
    )
    inference_precision: Literal["fp32", "auto"] = Field(
        default="fp32",
        description="fp32: compute in the artifact's precision (the same detections as ONNX Runtime); auto: "
        "OpenVINO's default for the device (bf16 on x86 CPUs that have it, fp16 on Arm and GPUs: faster, "
        "confidences differ by up to ~0.03).",
    )
    cache_dir: Path | None = Field(
        default=None,
        description="Directory where compiled models are cached; unset in agent.yaml = <state_dir>/openvino.",
    )
    cache_max_mb: int = Field(
        default=CACHE_MAX_MB,
        ge=0,
        description="The most MiB of compiled models the cache keeps: when the bundle store removes versions, "
        "those of models no installed version uses are removed, then the oldest beyond this, never those of "
        "the current and previous versions.",
    )


def with_state_dir(config: OpenVINOConfig, state_dir: Path) -> OpenVINOConfig:
    """The compiled-model cache under the state directory, unless agent.yaml names one."""
    if config.cache_dir is not None:
        return config
    return config.model_copy(update={"cache_dir": state_dir / "openvino"})


BACKEND = Backend(
    name=KEY,
    config=OpenVINOConfig,
    summary="OpenVINO: device (CPU, GPU, NPU), performance hint, threads, compiled-model cache.",
    formats=("onnx", "openvino"),
    # after ONNX Runtime on CPU boards: ``runtime: auto`` keeps what it served; autotune
    # measures OpenVINO against it and serves whichever is faster
    rank={"arm": 25, "x86": 15},
    libraries=("openvino",),
    availability=lazy(_CODE, "availability"),
    load=lazy(_CODE, "load"),
    device_label=lazy(_CODE, "device_label"),
    tune=lazy(_CODE, "tune"),
    with_state_dir=with_state_dir,
    candidates=lazy(_CODE, "candidates"),
    # loaded in the agent's process, OpenVINO keeps +105 MB resident for the demo detector, 90 MB
    # of it after closing (docs/benchmarks.md), in a process that may serve another runtime
    measured_apart=True,
    caches=(
        Cache(
            "compiled models",
            folder=lambda config: config.cache_dir,
            entries=lazy(_CODE, "cache_entries"),
            max_mb=lambda config: config.cache_max_mb,
            model_hash=lazy(_CODE, "model_hash"),
        ),
    ),
)
