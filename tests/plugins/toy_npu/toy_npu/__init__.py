"""A third-party runtime backend for edge-agent, as a vendor's package would hold one
(docs/architecture.md's worked example): a simulated NPU, ``toy-npu0``, that runs ONNX models
through ONNX Runtime's CPU provider, with a settings section of its own in agent.yaml
(``runtimes: {toynpu: {threads: 2}}``) and ``runtime: toynpu``.

edge-agent finds `BACKEND` through the ``edge_agent.runtimes`` entry point in pyproject.toml.
Like every backend module, this one imports its library (here onnxruntime, for a real NPU its
vendor's) only inside `availability` and `load`, never at import: edge-agent imports this
module in its own process, and its check processes import the library.

``TOY_NPU_CRASH=probe`` in the environment makes the probe abort its process, as a native
library built for another device would.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from runtimes.base import (
    Backend,
    BackendConfig,
    InferenceError,
    LoadOptions,
    ModelLoadError,
    Runtime,
    RuntimeInfo,
    TensorSpec,
    check_inputs,
    guess_layout,
)
from runtimes.metadata import parse_metadata

NAME = "toynpu"
DEVICE = "toy-npu0"
_TYPES = {"tensor(float)": np.float32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8, "tensor(int64)": np.int64}


class ToyNpuConfig(BackendConfig):
    """Settings of the toy NPU: the ``runtimes.toynpu`` section of agent.yaml."""

    type: Literal["toynpu"] = "toynpu"
    threads: int = Field(default=1, ge=1, description="CPU threads the simulated NPU computes with.")


def availability() -> RuntimeInfo:
    """Whether the toy NPU's driver (onnxruntime) imports here; its one device."""
    if os.environ.get("TOY_NPU_CRASH") == "probe":
        os.abort()
    try:
        import onnxruntime  # noqa: F401 (the driver: imported only to see that it is there)
    except ImportError as exc:
        return RuntimeInfo(name=NAME, available=False, reason=f"the toy NPU's driver is missing ({exc})")
    return RuntimeInfo(name=NAME, available=True, version="0.1.0", devices=(DEVICE,))


class ToyNpuRuntime(Runtime):
    """An ONNX model on the toy NPU: one ONNX Runtime CPU session (thread-safe, so `concurrent`)."""

    name = NAME
    concurrent = True

    def __init__(self, model_path: Path, config: ToyNpuConfig, warmup: bool) -> None:
        super().__init__(model_path)
        import onnxruntime as ort

        if not model_path.is_file():
            raise ModelLoadError(f"model file not found: {model_path}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = config.threads
        try:
            self._session: Any = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ONNX Runtime raises its own exception types
            raise ModelLoadError(f"the toy NPU cannot load {model_path.name}: {exc}") from exc
        self.inputs = [_spec(node) for node in self._session.get_inputs()]
        self.outputs = [_spec(node) for node in self._session.get_outputs()]
        self.metadata = parse_metadata(self._session.get_modelmeta().custom_metadata_map)
        if warmup:
            self.warmup()

    @property
    def device(self) -> str:
        return DEVICE

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        check_inputs(self.inputs, arrays)
        if self._session is None:
            raise InferenceError(f"{self.model_path.name} was closed")
        feed = {spec.name: array for spec, array in zip(self.inputs, arrays, strict=True)}
        return list(self._session.run(None, feed))

    def close(self) -> None:
        self._session = None


def _spec(node: Any) -> TensorSpec:
    if node.type not in _TYPES:
        raise ModelLoadError(f"the toy NPU cannot hold a {node.type} tensor ({node.name})")
    shape = tuple(d if isinstance(d, int) and d > 0 else None for d in node.shape)
    return TensorSpec(node.name, shape, np.dtype(_TYPES[node.type]), layout=guess_layout(shape))


def load(model_path: Path, config: ToyNpuConfig, options: LoadOptions) -> ToyNpuRuntime:
    return ToyNpuRuntime(model_path, config, options.warmup)


def tune(config: ToyNpuConfig, device: str, threads: int | None) -> ToyNpuConfig:
    """Autotune's choice served: the toy declares no candidates of its own, so autotune measured
    its settings as they are (threads None) on its one device; the settings stay as they are."""
    return config.model_copy(update={"threads": threads}) if threads else config


BACKEND = Backend(
    name=NAME,
    config=ToyNpuConfig,
    summary="The toy NPU: threads.",
    formats=("onnx",),
    rank={"nvidia": 5, "arm": 5, "x86": 5},  # ahead of every in-tree backend wherever it is installed
    libraries=("toy_npu",),
    availability=availability,
    load=load,
    device_label=lambda info: DEVICE,
    tune=tune,  # autotune measures it like the others (its one default candidate) and may choose it
)
