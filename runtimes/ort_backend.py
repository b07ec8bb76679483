"""ONNX Runtime backend (`runtime: onnxruntime`).

Execution providers are taken in the configured order from those the installed onnxruntime
build offers (TensorRT EP with FP16 and an engine cache, CUDA, OpenVINO, then CPU, which is
always last). The library is imported only when a model is loaded or availability is asked.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from runtimes.base import (
    BundleModel,
    InferenceError,
    LoadOptions,
    ModelLoadError,
    NotAModelError,
    Runtime,
    RuntimeInfo,
    RuntimeUnavailable,
    TensorSpec,
    TuneCandidate,
    check_inputs,
    first_line,
    guess_layout,
    return_freed_memory,
    usable_cores,
    worker_variants,
)
from runtimes.metadata import parse_metadata
from runtimes.ort_settings import KEY as KEY
from runtimes.ort_settings import OnnxRuntimeConfig as OnnxRuntimeConfig
from runtimes.ort_settings import ProviderName as ProviderName

log = logging.getLogger(__name__)

PROVIDERS: dict[ProviderName, str] = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
_ORT_TYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(bool)": np.dtype(np.bool_),
}


#: the execution providers the policy's reasons name, best first (`device_label`)
_PROVIDER_LABELS = (
    ("TensorrtExecutionProvider", "TensorRT EP"),
    ("CUDAExecutionProvider", "CUDA EP"),
    ("OpenVINOExecutionProvider", "OpenVINO EP"),
    ("CPUExecutionProvider", "CPU"),
)


def _import_ort() -> Any:
    try:
        import onnxruntime
    except ImportError as exc:
        raise RuntimeUnavailable(f"onnxruntime is not installed ({exc})") from exc
    return onnxruntime


def availability() -> RuntimeInfo:
    """Whether onnxruntime imports here, its version and execution providers."""
    try:
        ort = _import_ort()
    except RuntimeUnavailable as exc:
        return RuntimeInfo(name=KEY, available=False, reason=str(exc))
    return RuntimeInfo(
        name=KEY,
        available=True,
        version=str(ort.__version__),
        devices=tuple(ort.get_available_providers()),
    )


def device_label(info: RuntimeInfo) -> str:
    """The best execution provider the installed build offers, as the policy's reasons name it."""
    return next((label for provider, label in _PROVIDER_LABELS if provider in info.devices), "CPU")


def provider_list(config: OnnxRuntimeConfig, installed: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """The (provider, options) pairs to hand to ONNX Runtime: preferred ones that are installed,
    in order, with CPU last."""
    chosen: list[tuple[str, dict[str, Any]]] = []
    for key in [*config.providers, "cpu"]:
        name = PROVIDERS[key]
        if name not in installed or any(name == c[0] for c in chosen):
            continue
        options: dict[str, Any] = {}
        if key == "tensorrt":
            options["trt_fp16_enable"] = config.trt_fp16
            if config.trt_engine_cache_dir is not None:
                options["trt_engine_cache_enable"] = True
                options["trt_engine_cache_path"] = str(config.trt_engine_cache_dir)
        chosen.append((name, options))
    return chosen


def _spec(node: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) and d > 0 else None for d in node.shape)
    dtype = _ORT_TYPES.get(node.type)
    if dtype is None:
        raise ModelLoadError(f"tensor {node.name!r} has unsupported type {node.type}")
    return TensorSpec(node.name, shape, dtype, layout=guess_layout(shape))


class OnnxRuntimeBackend(Runtime):
    """A model loaded into an `onnxruntime.InferenceSession`."""

    name = KEY
    concurrent = True  # InferenceSession.run is thread-safe; each call has its own buffers

    def __init__(self, model_path: Path, config: OnnxRuntimeConfig | None = None, warmup: bool = True) -> None:
        super().__init__(model_path)
        self.config = config or OnnxRuntimeConfig()
        ort = _import_ort()
        if not model_path.is_file():
            raise ModelLoadError(f"model file not found: {model_path}")
        options = ort.SessionOptions()
        options.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[self.config.graph_optimization]
        options.enable_mem_pattern = self.config.memory_pattern
        options.intra_op_num_threads = self.config.intra_op_threads
        options.inter_op_num_threads = self.config.inter_op_threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.config.spinning else "0")
        options.log_severity_level = 3  # errors only: warnings go through our own logging
        providers = provider_list(self.config, ort.get_available_providers())
        if self.config.trt_engine_cache_dir is not None:
            os.makedirs(self.config.trt_engine_cache_dir, exist_ok=True)
        try:
            self._session = ort.InferenceSession(str(model_path), sess_options=options, providers=providers)
        except Exception as exc:  # ORT raises its own pybind exception types
            error = NotAModelError if type(exc).__name__ == "InvalidProtobuf" else ModelLoadError
            raise error(f"ONNX Runtime cannot load {model_path}: {first_line(exc)}") from exc
        self.inputs = [_spec(i) for i in self._session.get_inputs()]
        self.outputs = [_spec(o) for o in self._session.get_outputs()]
        self._output_names = [o.name for o in self.outputs]
        self.metadata = parse_metadata(self._session.get_modelmeta().custom_metadata_map)
        self._providers = list(self._session.get_providers())
        log.info("onnxruntime loaded %s with providers %s", model_path, self._providers)
        if warmup:
            self.warmup()
        # building the session freed the model's protobuf and the graph before optimisation in
        # glibc's heap, which keeps it: 15 MB of a YOLOv8n at 640 (docs/benchmarks.md, bench RSS)
        return_freed_memory()

    @property
    def device(self) -> str:
        return str(self._providers[0])

    def close(self) -> None:
        """Drop the session (ONNX Runtime frees its weights and arenas when the last call using
        it ends) and return the freed memory to the system."""
        if self._session is not None:
            self._session = None
            return_freed_memory()

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        check_inputs(self.inputs, arrays)
        feed = {spec.name: array for spec, array in zip(self.inputs, arrays, strict=True)}
        session = self._session
        if session is None:
            raise InferenceError(f"{self.model_path.name} was closed")
        try:
            return list(session.run(self._output_names, feed))
        except Exception as exc:
            raise InferenceError(f"ONNX Runtime failed on {self.model_path.name}: {exc}") from exc


def load(model_path: Path, config: OnnxRuntimeConfig, options: LoadOptions) -> OnnxRuntimeBackend:
    """The registry's loader. With the thread count left to ONNX Runtime (0), each call in flight
    (`options.workers`) gets an equal share of the cores this process may use. The share is set
    whenever the process runs under an affinity mask too: left at 0, ONNX Runtime 1.32 starts one
    thread per CPU of the machine and pins each to its own CPU, escaping ``taskset -c 0`` and
    systemd's ``CPUAffinity=`` (measured: 107 ms of CPU in 54 ms of wall on "one" core)."""
    confined = usable_cores() < (os.cpu_count() or 1)
    if config.intra_op_threads == 0 and (options.workers > 1 or confined):
        config = config.model_copy(update={"intra_op_threads": max(1, usable_cores() // options.workers)})
    return OnnxRuntimeBackend(model_path, config, options.warmup)


def tune(config: OnnxRuntimeConfig, provider: str, threads: int | None) -> OnnxRuntimeConfig:
    """Autotune's choice: only the execution provider it measured (an ONNX Runtime name such as
    ``"CUDAExecutionProvider"``; CPU when unknown), with its threads per call (None: ORT's default)."""
    key = next((k for k, name in PROVIDERS.items() if name == provider), "cpu")
    return config.model_copy(update={"providers": [key], "intra_op_threads": threads or 0})


def candidates(config: OnnxRuntimeConfig, model: BundleModel, info: RuntimeInfo, variants: bool) -> list[TuneCandidate]:
    """Per configured execution provider that this onnxruntime offers (and the CPU's), one call
    in flight; with `variants`, on the CPU each of `worker_variants` (calls in flight, threads
    each). One row saying why when ONNX Runtime cannot run here."""
    if not info.available:
        return [TuneCandidate("CPU", model.precision, config, unavailable=info.reason or "unavailable")]
    found = []
    for key in dict.fromkeys([*config.providers, "cpu"]):
        provider = PROVIDERS[key]
        if provider not in info.devices:
            continue
        shapes: list[tuple[int, int | None]] = [(1, None)]
        if variants and key == "cpu":
            shapes = [(workers, threads) for workers, threads in worker_variants(usable_cores())]
        for workers, threads in shapes:
            tuned = config.model_copy(update={"providers": [key], "intra_op_threads": threads or 0})
            found.append(TuneCandidate(provider, model.precision, tuned, workers, threads))
    return found
