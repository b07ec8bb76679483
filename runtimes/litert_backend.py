"""LiteRT backend (`runtime: litert`): TFLite models through `ai_edge_litert`, or the older
`tflite_runtime` package where that is what the device has.

Quantized int8/uint8 tensors keep their integer dtype in `infer`; their scale and zero point
are in the `TensorSpec`s, so preprocessing quantizes and decoding dequantizes. An external
delegate (e.g. ``libedgetpu.so.1``) can be loaded by path.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from importlib import metadata as importlib_metadata
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
    Quantization,
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
)
from runtimes.litert_settings import KEY as KEY
from runtimes.litert_settings import LiteRTConfig as LiteRTConfig
from runtimes.metadata import read_tflite_metadata

log = logging.getLogger(__name__)

#: (module, distribution) pairs tried in order
_INTERPRETER_MODULES = (
    ("ai_edge_litert.interpreter", "ai-edge-litert"),
    ("tflite_runtime.interpreter", "tflite-runtime"),
)


def _import_interpreter() -> tuple[Any, str]:
    """Return the interpreter module and its distribution's name."""
    errors = []
    for module, dist in _INTERPRETER_MODULES:
        try:
            return __import__(module, fromlist=["Interpreter"]), dist
        except ImportError as exc:
            errors.append(f"{module}: {exc}")
    raise RuntimeUnavailable("neither ai-edge-litert nor tflite-runtime is installed (" + "; ".join(errors) + ")")


def availability() -> RuntimeInfo:
    """Whether a LiteRT interpreter imports here, its version and built-in delegates."""
    try:
        _, dist = _import_interpreter()
    except RuntimeUnavailable as exc:
        return RuntimeInfo(name=KEY, available=False, reason=str(exc))
    try:
        version = importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        version = None
    return RuntimeInfo(name=KEY, available=True, version=version, devices=("xnnpack",))


def _spec(detail: dict[str, Any]) -> TensorSpec:
    signature = detail.get("shape_signature", detail["shape"])
    shape = tuple(int(d) if int(d) > 0 else None for d in signature)
    scale, zero_point = detail.get("quantization", (0.0, 0))
    quantization = Quantization(float(scale), int(zero_point)) if scale else None
    return TensorSpec(
        name=str(detail["name"]),
        shape=shape,
        dtype=np.dtype(detail["dtype"]),
        layout=guess_layout(shape),
        quantization=quantization,
    )


class LiteRTBackend(Runtime):
    """A .tflite model in a LiteRT interpreter."""

    name = KEY

    def __init__(self, model_path: Path, config: LiteRTConfig | None = None, warmup: bool = True) -> None:
        super().__init__(model_path)
        self.config = config or LiteRTConfig()
        module, _ = _import_interpreter()
        if not model_path.is_file():
            raise ModelLoadError(f"model file not found: {model_path}")
        delegates = []
        self._device = "xnnpack"
        if self.config.delegate is not None:
            try:
                delegates.append(module.load_delegate(str(self.config.delegate), dict(self.config.delegate_options)))
            except (ValueError, OSError, RuntimeError) as exc:
                raise RuntimeUnavailable(
                    f"cannot load LiteRT delegate {self.config.delegate}: {exc} "
                    "(check the path, the library's architecture, and that the accelerator is attached)"
                ) from exc
            self._device = self.config.delegate.name
        threads = self.config.num_threads or usable_cores()
        with model_path.open("rb") as f:
            if f.read(8)[4:8] != b"TFL3":
                raise NotAModelError(f"LiteRT cannot load {model_path}: not a TFLite flatbuffer (no TFL3 identifier)")
        try:
            self._interpreter = module.Interpreter(
                model_path=str(model_path), num_threads=threads, experimental_delegates=delegates or None
            )
            self._interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise ModelLoadError(f"LiteRT cannot load {model_path}: {first_line(exc)}") from exc
        self._input_details = self._interpreter.get_input_details()
        self._output_details = self._interpreter.get_output_details()
        self.inputs = [_spec(d) for d in self._input_details]
        self.outputs = [_spec(d) for d in self._output_details]
        self.metadata = read_tflite_metadata(model_path)
        log.info("litert loaded %s on %s with %d threads", model_path, self._device, threads)
        if warmup:
            self.warmup()

    @property
    def device(self) -> str:
        return self._device

    @property
    def quantized(self) -> bool:
        """Whether the model holds int8/uint8 tensors (weights or activations)."""
        return any(d["dtype"] in (np.int8, np.uint8) for d in self._interpreter.get_tensor_details())

    def _resize_inputs(self, arrays: Sequence[npt.NDArray[Any]]) -> None:
        """Resize dynamic inputs to the shapes given (a no-op for fixed shapes)."""
        changed = False
        for detail, array in zip(self._input_details, arrays, strict=True):
            if tuple(detail["shape"]) != array.shape:
                self._interpreter.resize_tensor_input(detail["index"], array.shape)
                changed = True
        if changed:
            self._interpreter.allocate_tensors()
            self._input_details = self._interpreter.get_input_details()
            self._output_details = self._interpreter.get_output_details()

    def for_worker(self) -> LiteRTBackend:
        """Another interpreter on the same model file for another thread (LiteRT's interpreters
        are not thread-safe; the file is memory-mapped, its pages shared), not warmed up."""
        return LiteRTBackend(self.model_path, self.config, warmup=False)

    def close(self) -> None:
        """Drop the interpreter and its tensors, and return the freed memory to the system."""
        if self._interpreter is not None:
            self._interpreter = None
            return_freed_memory()

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        check_inputs(self.inputs, arrays)
        if self._interpreter is None:
            raise InferenceError(f"{self.model_path.name} was closed")
        try:
            self._resize_inputs(arrays)
            for detail, array in zip(self._input_details, arrays, strict=True):
                self._interpreter.set_tensor(detail["index"], array)
            self._interpreter.invoke()
            return [self._interpreter.get_tensor(d["index"]) for d in self._output_details]
        except (ValueError, RuntimeError) as exc:
            raise InferenceError(f"LiteRT failed on {self.model_path.name}: {exc}") from exc


def load(model_path: Path, config: LiteRTConfig, options: LoadOptions) -> LiteRTBackend:
    """The registry's loader (one interpreter serves one call at a time: `options.workers` is
    served by `LiteRTBackend.for_worker`)."""
    return LiteRTBackend(model_path, config, options.warmup)


def tune(config: LiteRTConfig, delegate: str, threads: int | None) -> LiteRTConfig:
    """Autotune's choice: its threads per call (None leaves the configured count); the delegate
    it measured is the configured one or XNNPACK, already in `config`."""
    return config.model_copy(update={"num_threads": threads}) if threads else config


def candidates(config: LiteRTConfig, model: BundleModel, info: RuntimeInfo, variants: bool) -> list[TuneCandidate]:
    """XNNPACK (no external delegate), and the configured external delegate when there is one;
    each saying why when LiteRT cannot run here."""
    why = None if info.available else info.reason or "unavailable"
    found = [TuneCandidate("xnnpack", model.precision, config.model_copy(update={"delegate": None}), unavailable=why)]
    if config.delegate is not None:
        found.append(TuneCandidate(config.delegate.name, model.precision, config, unavailable=why))
    return found
