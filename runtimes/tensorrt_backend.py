"""TensorRT backend (`runtime: tensorrt`): its settings, and whether TensorRT can run here.

The engine builder and executor arrive with the TensorRT issue; until then this module holds
the `runtimes.tensorrt` section of agent.yaml (validated now, so configs written today keep
working) and reports TensorRT unavailable with the installed library's version.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runtimes.base import Precision, RuntimeInfo

KEY = "tensorrt"


class TensorRTConfig(BaseModel):
    """Settings of the TensorRT backend."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["tensorrt"] = "tensorrt"
    precision: Precision = Field(
        default="fp16",
        description="Engine precision: fp16 where the GPU has fast FP16; int8 needs a Q/DQ model or the "
        "bundle's calibration images.",
    )
    engine_cache_dir: Path | None = Field(
        default=None, description="Where built engines are cached; default: <state_dir>/engines."
    )
    workspace_mb: int = Field(default=1024, ge=16, description="Builder workspace memory-pool limit in MiB.")
    timing_cache: bool = Field(default=True, description="Keep TensorRT's timing cache beside the engines.")


def availability() -> RuntimeInfo:
    """TensorRT's native backend is not part of this release; say so, with the library version."""
    try:
        trt = importlib.import_module("tensorrt")
        version = str(getattr(trt, "__version__", "unknown"))
    except ImportError:
        return RuntimeInfo(name=KEY, available=False, reason="tensorrt (JetPack / TensorRT wheel) is not installed")
    return RuntimeInfo(
        name=KEY,
        available=False,
        version=version,
        reason="this edge-agent release has no native TensorRT backend yet; "
        "ONNX Runtime's TensorRT execution provider is used where installed",
    )
