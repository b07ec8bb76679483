"""ONNX Runtime's settings (the ``runtimes.onnxruntime`` section of agent.yaml) and its registry
entry, apart from `runtimes.ort_backend` (the library's wrapper, which the entry names lazily):
importing the registry, to validate a config or to load another backend, imports this only.
`runtimes.ort_backend` re-exports the settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from runtimes.base import Backend, BackendConfig, lazy

KEY = "onnxruntime"
_CODE = "runtimes.ort_backend"

ProviderName = Literal["tensorrt", "cuda", "openvino", "cpu"]


class OnnxRuntimeConfig(BackendConfig):
    """Settings of the ONNX Runtime backend."""

    type: Literal["onnxruntime"] = "onnxruntime"
    providers: list[ProviderName] = Field(
        default=["tensorrt", "cuda", "openvino", "cpu"],
        description="Execution providers in order of preference; those not installed are "
        "skipped and CPU is always the last resort.",
    )
    trt_fp16: bool = Field(default=True, description="Let the TensorRT EP build FP16 engines.")
    trt_engine_cache_dir: Path | None = Field(
        default=None, description="Directory where the TensorRT EP caches built engines."
    )
    graph_optimization: Literal["disable", "basic", "extended", "all"] = Field(
        default="all", description="ONNX Runtime graph optimization level."
    )
    intra_op_threads: int = Field(
        default=0,
        ge=0,
        description="Threads inside one op; 0 = ORT's default, or the usable cores / workers under an "
        "affinity mask (taskset, CPUAffinity=) or with several workers.",
    )
    inter_op_threads: int = Field(default=0, ge=0, description="Threads across ops; 0 = ORT's default.")
    memory_pattern: bool = Field(
        default=False,
        description="Plan one block per run for all intermediate tensors (ORT's default). Off, the "
        "arena reuses freed tensors instead: 20-23 MB less resident for YOLOv8n at 640x640, "
        "with no consistent speed difference (docs/benchmarks.md).",
    )
    spinning: bool = Field(
        default=False,
        description="Let idle ORT threads spin-wait for work instead of sleeping (ONNX Runtime's own "
        "default; true brings it back). Off, the default, leaves that CPU to capture, other cameras and "
        "the board's temperature: on two cores 0.5-0.79x the CPU per frame at the same or lower latency "
        "(docs/benchmarks.md, core budgets).",
    )


BACKEND = Backend(
    name=KEY,
    config=OnnxRuntimeConfig,
    summary="ONNX Runtime: execution providers in order, threads, ...",
    formats=("onnx",),
    rank={"nvidia": 20, "arm": 20, "x86": 10},
    libraries=("onnxruntime",),
    availability=lazy(_CODE, "availability"),
    load=lazy(_CODE, "load"),
    device_label=lazy(_CODE, "device_label"),
    tune=lazy(_CODE, "tune"),
    candidates=lazy(_CODE, "candidates"),
)
