"""Apache TVM's settings (the ``runtimes.tvm`` section of agent.yaml) and its registry entry,
apart from `runtimes.tvm_backend` (the compiler and runtime wrapper, which the entry names
lazily): importing the registry imports this only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from runtimes.base import CACHE_MAX_MB, Backend, BackendConfig, Cache, lazy

KEY = "tvm"
_CODE = "runtimes.tvm_backend"


class TVMConfig(BackendConfig):
    """Settings of the Apache TVM backend."""

    type: Literal["tvm"] = "tvm"
    allow_compiled: bool = Field(
        default=False,
        description="Load compiled TVM modules (.so: native code) shipped in bundles. Off: only ONNX models, "
        "compiled here, run on TVM. A bundle holding one is installed only when signed by a trusted key.",
    )
    cache_dir: Path | None = Field(
        default=None,
        description="Directory where modules compiled here are cached; unset in agent.yaml = <state_dir>/tvm "
        "(a command line without a state directory: ~/.cache/edge-agent/tvm).",
    )
    cache_max_mb: int = Field(
        default=CACHE_MAX_MB,
        ge=0,
        description="The most MiB of compiled modules the cache keeps (pruned with the bundle store's versions, "
        "as OpenVINO's compiled models).",
    )


def with_state_dir(config: TVMConfig, state_dir: Path) -> TVMConfig:
    """The compiled-module cache under the state directory, unless agent.yaml names one."""
    if config.cache_dir is not None:
        return config
    return config.model_copy(update={"cache_dir": state_dir / "tvm"})


BACKEND = Backend(
    name=KEY,
    config=TVMConfig,
    summary="Apache TVM: compiled modules from signed bundles (allow_compiled), compiled-module cache.",
    # a module compiled by bundle build --tvm-target first; an ONNX model is compiled here
    formats=("tvm", "onnx"),
    # never picked by ``runtime: auto``: named in ``runtime: tvm`` or measured by the matrix
    rank={},
    libraries=("tvm", "tvm_ffi"),
    availability=lazy(_CODE, "availability"),
    load=lazy(_CODE, "load"),
    with_state_dir=with_state_dir,
    candidates=lazy(_CODE, "candidates"),
    # the compiler (LLVM) and its module stay resident in the process that loaded them
    measured_apart=True,
    caches=(
        Cache(
            "compiled modules",
            folder=lambda config: config.cache_dir,
            entries=lazy(_CODE, "cache_entries"),
            max_mb=lambda config: config.cache_max_mb,
        ),
    ),
)
