"""TensorRT backend (`runtime: tensorrt`): its settings, whether it runs here, and serving engines.

A TensorRT engine is built once per device from an ONNX artifact (`runtimes.tensorrt_build`)
and kept in the engine cache (`runtimes.engine_cache`). `open_engine` serves a cached engine
and never builds: when none is cached it raises `EngineNotReady`, so a caller that must not
wait (activation, the cameras) falls back to the next runtime and builds in the background
(`agent.serving.engines`); ``edge-agent engine build`` builds ahead of time.

`TensorRTBackend` runs an engine by tensor name (TensorRT 10): per call it sets the shapes of
dynamic inputs, the address of every input and output, and enqueues ``execute_async_v3`` on
its stream, between copies through pinned host buffers; FP16 outputs come back as float32.
Device memory comes from `runtimes.cuda_memory` (cuda-python or pycuda). An execution context
serves one call at a time (`concurrent` is False; a lock guards it); `for_worker` gives another
thread its own context, stream and buffers on the same engine (one engine in GPU memory).
"""

from __future__ import annotations

import copy
import logging
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from runtimes.base import (
    BackendError,
    BundleModel,
    InferenceError,
    LoadOptions,
    ModelLoadError,
    Precision,
    Progress,
    Runtime,
    RuntimeInfo,
    RuntimeUnavailable,
    TensorSpec,
    TuneCandidate,
    check_inputs,
    guess_layout,
    return_freed_memory,
)
from runtimes.cuda_memory import DeviceBuffer, DeviceMemory, open_device_memory
from runtimes.engine_cache import EngineCache, EngineRecord
from runtimes.metadata import parse_metadata
from runtimes.tensorrt_build import make_logger, require_tensorrt, shape_of
from runtimes.tensorrt_engines import prepare_engine
from runtimes.tensorrt_settings import KEY as KEY
from runtimes.tensorrt_settings import EngineNotReady as EngineNotReady
from runtimes.tensorrt_settings import ProfileSettings as ProfileSettings
from runtimes.tensorrt_settings import TensorRTConfig as TensorRTConfig
from runtimes.tensorrt_settings import device_label as device_label
from runtimes.tensorrt_settings import engine_cache as engine_cache
from runtimes.tensorrt_settings import engine_key as engine_key
from runtimes.tensorrt_settings import engine_precision as engine_precision
from runtimes.tensorrt_settings import for_bundle as for_bundle
from runtimes.tensorrt_settings import with_state_dir as with_state_dir

log = logging.getLogger(__name__)


class EngineLoadError(ModelLoadError):
    """TensorRT could not deserialize an engine file (corrupt, or built for another version)."""


def availability() -> RuntimeInfo:
    """Whether TensorRT imports and a CUDA library (cuda-python or pycuda) reaches a GPU here."""
    try:
        version = require_tensorrt()
    except RuntimeUnavailable as exc:
        return RuntimeInfo(name=KEY, available=False, reason=str(exc))
    try:
        memory = open_device_memory()
        info = memory.info()
        memory.close()
    except (RuntimeUnavailable, RuntimeError) as exc:
        return RuntimeInfo(name=KEY, available=False, version=version, reason=str(exc))
    major, minor = info.compute_capability
    return RuntimeInfo(name=KEY, available=True, version=version, devices=(f"{info.name} (sm {major}.{minor})",))


def numpy_dtype(dtype: Any) -> np.dtype[Any]:
    """The numpy dtype of a TensorRT `DataType` (`EngineLoadError` for one numpy lacks, e.g. FP8)."""
    import tensorrt as trt

    types: dict[trt.DataType, type[np.generic]] = {
        trt.DataType.FLOAT: np.float32,
        trt.DataType.HALF: np.float16,
        trt.DataType.INT8: np.int8,
        trt.DataType.UINT8: np.uint8,
        trt.DataType.INT32: np.int32,
        trt.DataType.INT64: np.int64,
        trt.DataType.BOOL: np.bool_,
    }
    if dtype not in types:
        raise EngineLoadError(f"engine tensor type {dtype} has no numpy equivalent")
    return np.dtype(types[dtype])


@dataclass(frozen=True)
class _Tensor:
    """One engine input or output: numpy dtype as the engine holds it, largest shape, buffers."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # -1 for a dynamic axis
    device: DeviceBuffer
    host: npt.NDArray[Any]  # pinned, flat, sized for the largest shape


class TensorRTBackend(Runtime):
    """A deserialized engine with one execution context, its stream and its buffers.

    `model_path` is the ONNX file the engine was built from (what the pipeline names); `record`
    carries the model's metadata and how the engine was built. `for_worker` makes a worker:
    another context with its own stream and buffers on this engine, which closing leaves open."""

    _owner = True  # False for a worker: its close frees its context, not the engine or the memory

    name = KEY
    #: the cache the engine came from (`open_engine` sets it), where `reject` records its failure
    cache: EngineCache | None = None

    def __init__(
        self,
        engine_path: Path,
        model_path: Path,
        record: EngineRecord,
        memory: DeviceMemory | None = None,
        warmup: bool = True,
    ) -> None:
        super().__init__(model_path)
        require_tensorrt()
        import tensorrt as trt

        self.record = record
        self._errors: list[str] = []
        self._logger = make_logger(self._errors)
        self._memory = memory or open_device_memory()
        self._lock = threading.Lock()
        self._tensors: list[_Tensor] = []
        self.max_batch: int | None = None  # the most frames one call takes (the profile's largest batch)
        self._trt_runtime = trt.Runtime(self._logger)
        # an engine is data to TensorRT unless it carries host code (a lean runtime, plugins):
        # edge-agent never lets one run, whatever this TensorRT's default is (docs/security.md)
        self._trt_runtime.engine_host_code_allowed = False
        try:
            data = engine_path.read_bytes()
        except OSError as exc:
            raise EngineLoadError(f"cannot read the engine {engine_path}: {exc.strerror}") from exc
        engine = self._trt_runtime.deserialize_cuda_engine(data)
        if engine is None:
            detail = "; ".join(self._errors) or "TensorRT returned no engine"
            raise EngineLoadError(f"TensorRT cannot deserialize {engine_path.name}: {detail}")
        self._engine: trt.ICudaEngine | None = engine
        self._context: trt.IExecutionContext | None = engine.create_execution_context()
        self._stream = self._memory.stream()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._input_names = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._output_names = [n for n in names if n not in self._input_names]
        try:
            self._allocate()
        except Exception:
            self.close()
            raise
        self.inputs = [self._spec(t, convert=False) for t in self._tensors[: len(self._input_names)]]
        self.outputs = [self._spec(t, convert=True) for t in self._tensors[len(self._input_names) :]]
        self.metadata = parse_metadata(record.metadata)
        log.info("tensorrt serving %s (%s)", model_path.name, record.key.describe())
        if warmup:
            self.warmup()

    def _allocate(self) -> None:
        """Device buffers and pinned host buffers for the largest shapes the profile allows."""
        import tensorrt as trt

        engine, context = self._engine, self._context
        assert engine is not None and context is not None  # set by __init__ before this runs
        for name in self._input_names:
            shape = shape_of(engine.get_tensor_shape(name))
            largest = shape_of(engine.get_tensor_profile_shape(name, 0)[2]) if -1 in shape else shape
            if shape[:1] == (-1,):
                self.max_batch = min(largest[0], self.max_batch or largest[0])
            context.set_input_shape(name, trt.Dims(list(largest)))
            self._tensors.append(self._buffers(name, numpy_dtype(engine.get_tensor_dtype(name)), shape, largest))
        for name in self._output_names:
            largest = shape_of(context.get_tensor_shape(name))
            if min(largest, default=0) < 0:
                raise EngineLoadError(f"{self.model_path.name}: output {name} has no bounded shape {largest}")
            shape = shape_of(engine.get_tensor_shape(name))
            self._tensors.append(self._buffers(name, numpy_dtype(engine.get_tensor_dtype(name)), shape, largest))

    def _buffers(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...], largest: tuple[int, ...]) -> _Tensor:
        count = max(1, math.prod(largest))
        device = self._memory.alloc(count * dtype.itemsize)
        try:
            host = self._memory.pinned((count,), dtype)
        except Exception:
            self._memory.free(device)
            raise
        return _Tensor(name, dtype, shape, device, host)

    @staticmethod
    def _spec(tensor: _Tensor, convert: bool) -> TensorSpec:
        shape = tuple(None if d < 0 else d for d in tensor.shape)
        dtype = np.dtype(np.float32) if convert and tensor.dtype == np.float16 else tensor.dtype
        return TensorSpec(tensor.name, shape, dtype, layout=guess_layout(shape))

    @property
    def device(self) -> str:
        key = self.record.key
        return f"{key.gpu_name} ({self.record.built_precision or key.precision})"

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        check_inputs(self.inputs, arrays)
        import tensorrt as trt

        with self._lock:
            if self._context is None:
                raise InferenceError(f"{self.model_path.name} was closed")
            memory, context, stream = self._memory, self._context, self._stream
            inputs, outputs = self._tensors[: len(self.inputs)], self._tensors[len(self.inputs) :]
            for tensor, array in zip(inputs, arrays, strict=True):
                if -1 in tensor.shape and not context.set_input_shape(tensor.name, trt.Dims(list(array.shape))):
                    raise InferenceError(f"input {tensor.name}: shape {array.shape} is outside the engine's profile")
                staged = tensor.host[: array.size].reshape(array.shape)
                np.copyto(staged, array)
                memory.to_device(tensor.device, staged, stream)
            for tensor in self._tensors:
                context.set_tensor_address(tensor.name, tensor.device.address)
            del self._errors[:]
            if not context.execute_async_v3(stream.handle):
                detail = "; ".join(self._errors) or "execute_async_v3 returned False"
                raise InferenceError(f"TensorRT failed on {self.model_path.name}: {detail}")
            results = []
            for tensor in outputs:
                shape = shape_of(context.get_tensor_shape(tensor.name))
                staged = tensor.host[: math.prod(shape)].reshape(shape)
                memory.to_host(staged, tensor.device, stream)
                results.append(staged)
            memory.synchronize(stream)
            # the pinned buffers are reused by the next call: hand out copies (float32 for FP16)
            return [r.astype(np.float32) if r.dtype == np.float16 else r.copy() for r in results]

    def reject(self, message: str) -> EngineNotReady:
        """Never serve this engine again (it failed a check it must pass: the bundle's parity, the
        decoder's plausibility guard): its failure recorded in its cache, so it is not rebuilt
        either until the key changes, and the engine discarded. Returns what the next load raises."""
        if self.cache is not None:
            self.cache.record_failure(self.record.key, message)
            self.cache.discard(self.record.key)
        return EngineNotReady(message, self.record.key, message)

    def for_worker(self) -> TensorRTBackend:
        """Another execution context on this engine, with its own stream and buffers, for one
        more thread (TensorRT runs one call at a time per context); not warmed up. Close the
        workers before this runtime: the engine and the device memory are this one's."""
        with self._lock:
            if self._engine is None:
                raise InferenceError(f"{self.model_path.name} was closed")
            worker = copy.copy(self)  # the engine, record, specs and memory are shared
            worker._owner = False
            worker._lock = threading.Lock()
            worker._tensors = []
            worker._context = self._engine.create_execution_context()
            worker._stream = self._memory.stream()
        try:
            worker._allocate()
        except Exception:
            worker.close()
            raise
        return worker

    def close(self) -> None:
        """Wait for the stream, free the buffers and the stream; the runtime that loaded the
        engine also drops it and closes the device memory (idempotent)."""
        with self._lock:
            if getattr(self, "_context", None) is None:
                return
            memory = self._memory
            memory.synchronize(self._stream)
            for tensor in self._tensors:
                memory.free(tensor.device)
                memory.free_pinned(tensor.host)
            self._tensors = []
            memory.close_stream(self._stream)
            self._context = None
            self._engine = None
            if self._owner:
                memory.close()
        return_freed_memory()


def open_engine(
    model_path: Path,
    config: TensorRTConfig,
    memory: DeviceMemory | None = None,
    sha256: str | None = None,
    warmup: bool = True,
) -> TensorRTBackend:
    """Serve the cached engine of `model_path` (an ONNX file) for `config` on this GPU; never
    builds. Raises `EngineNotReady` when none is cached, or when the cached one fails to
    deserialize (it is discarded, so the next build replaces it)."""
    version = require_tensorrt()
    if not model_path.is_file():
        raise ModelLoadError(f"model file not found: {model_path}")
    memory = memory or open_device_memory()
    key = engine_key(model_path, config, memory.info(), version, sha256)
    cache = engine_cache(config)
    failure = cache.failure(key)  # a failed build, or an engine that failed its parity check: not served
    record = cache.lookup(key) if failure is None else None
    if record is None:
        why = f"its last build failed: {failure}" if failure else "it has not been built yet"
        memory.close()
        raise EngineNotReady(f"no TensorRT engine for {model_path.name} ({key.describe()}): {why}", key, failure)
    try:
        runtime = TensorRTBackend(cache.engine_path(key), model_path, record, memory, warmup)
        runtime.cache = cache
        return runtime
    except EngineLoadError as exc:
        cache.discard(key)
        memory.close()
        raise EngineNotReady(f"{exc}; the cached engine was discarded and will be built again", key) from exc


def load(model_path: Path, config: TensorRTConfig, options: LoadOptions) -> TensorRTBackend:
    """The registry's loader: `open_engine` (the cached engine, or `EngineNotReady`)."""
    return open_engine(model_path, config, warmup=options.warmup)


_PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8")


def candidates(config: TensorRTConfig, model: BundleModel, info: RuntimeInfo, variants: bool) -> list[TuneCandidate]:
    """An engine per precision, FP32, FP16 and INT8 (an explicitly quantized model's: INT8 only),
    on the GPU the probe found; INT8 of a float model needs the bundle's calibration images. One
    call in flight (an execution context serves one call at a time)."""
    qdq = engine_precision(model.path, "fp32") == "int8"
    gpu = info.devices[0] if info.devices else "GPU"
    found = []
    for precision in ("int8",) if qdq else _PRECISIONS:
        why = None if info.available else info.reason or "unavailable"
        if why is None and precision == "int8" and not qdq and model.calibration is None:
            why = "int8 needs a Q/DQ model or calibration images in the bundle"
        found.append(TuneCandidate(gpu, precision, config.model_copy(update={"precision": precision}), unavailable=why))
    return found


def prepare(config: TensorRTConfig, model: BundleModel, on_progress: Callable[[Progress], None]) -> None:
    """Build the candidate's engine, or find it cached, or take the bundle's prebuilt one
    (`prepare_engine`), so that it can be measured; `ModelLoadError` ("engine build failed: ...")
    when it cannot."""
    try:
        prepare_engine(
            model.path,
            config,
            sha256=model.sha256,
            calibration=model.calibration,
            prebuilt=model.prebuilt,
            on_progress=on_progress,
        )
    except BackendError as exc:
        raise ModelLoadError(f"engine build failed: {exc}") from exc
