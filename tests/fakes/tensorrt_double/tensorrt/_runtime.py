"""The double's runtime side: `Runtime`, `ICudaEngine`, `IExecutionContext` (TensorRT 10: I/O by
tensor name only; ``execute_async_v3`` on a stream, with the call order checked)."""

from __future__ import annotations

import numpy as np

from . import DataType, Dims, ILogger, TensorIOMode, _double, _shape, _Strict, nptype


class Runtime(_Strict):
    __slots__ = ("_logger", "engine_host_code_allowed")

    def __init__(self, logger: ILogger) -> None:
        if not isinstance(logger, ILogger):
            raise TypeError("Runtime needs an ILogger")
        self._logger = logger
        self.engine_host_code_allowed = False

    def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None:
        try:
            image = _double.EngineImage.parse(bytes(serialized_engine))
        except (ValueError, KeyError, TypeError) as exc:
            self._logger.log(
                ILogger.Severity.ERROR, f"IRuntime::deserializeCudaEngine: Error Code 1: Serialization ({exc})"
            )
            return None
        if image.host_code and not self.engine_host_code_allowed:
            self._logger.log(
                ILogger.Severity.ERROR,
                "IRuntime::deserializeCudaEngine: Error Code 1: Serialization (the engine contains host code "
                "and engine_host_code_allowed is false)",
            )
            return None
        if image.version != _double.VERSION:
            self._logger.log(
                ILogger.Severity.ERROR,
                f"The engine plan file is not compatible with this version of TensorRT, expecting library version "
                f"{_double.VERSION} got {image.version}, please rebuild.",
            )
            return None
        if image.gpu != _double.GPU.name or tuple(image.compute_capability) != _double.GPU.compute_capability:
            self._logger.log(ILogger.Severity.ERROR, f"The engine was built for {image.gpu}, not {_double.GPU.name}.")
            return None
        return ICudaEngine(image, self._logger)


class ICudaEngine(_Strict):
    __slots__ = ("_executor", "_image", "_logger", "_tensors")

    def __init__(self, image: _double.EngineImage, logger: ILogger) -> None:
        self._image, self._logger = image, logger
        self._tensors = {t["name"]: t for t in image.tensors}
        self._executor = _double.Executor(image)

    @property
    def num_io_tensors(self) -> int:
        return len(self._image.tensors)

    def get_tensor_name(self, index: int) -> str:
        return str(self._image.tensors[index]["name"])

    def _tensor(self, name: str) -> dict:
        if name not in self._tensors:
            raise KeyError(f"no I/O tensor named {name!r}")
        return self._tensors[name]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return TensorIOMode[self._tensor(name)["mode"]]

    def get_tensor_shape(self, name: str) -> Dims:
        return Dims(self._tensor(name)["shape"])

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType[self._tensor(name)["dtype"]]

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[Dims]:
        if profile_index != 0 or name not in self._image.profile:
            raise ValueError(f"{name!r} has no shapes in optimization profile {profile_index}")
        return [Dims(s) for s in self._image.profile[name]]

    def create_execution_context(self, strategy: object = None) -> IExecutionContext:
        return IExecutionContext(self)

    def serialize(self) -> bytes:
        return self._image.serialize()


class IExecutionContext(_Strict):
    """Checks the order of one inference: shapes, then addresses, then `execute_async_v3`."""

    __slots__ = ("_addresses", "_engine", "_shapes", "calls")

    def __init__(self, engine: ICudaEngine) -> None:
        self._engine = engine
        self._shapes: dict[str, list[int]] = {}
        self._addresses: dict[str, int] = {}
        self.calls: list[str] = []

    def _error(self, message: str) -> bool:
        self._engine._logger.log(ILogger.Severity.ERROR, message)
        return False

    def _inputs(self) -> list[dict]:
        return [t for t in self._engine._image.tensors if t["mode"] == "INPUT"]

    def _input_shape(self, tensor: dict) -> list[int] | None:
        return self._shapes.get(tensor["name"]) if -1 in tensor["shape"] else tensor["shape"]

    def set_input_shape(self, name: str, shape: Dims) -> bool:
        tensor = self._engine._tensor(name)
        dims = _shape(shape, "set_input_shape")
        if tensor["mode"] != "INPUT":
            return self._error(f"setInputShape: {name} is not an input")
        if len(dims) != len(tensor["shape"]) or any(
            f not in (-1, d) for f, d in zip(tensor["shape"], dims, strict=True)
        ):
            return self._error(f"setInputShape: {name} {dims} does not match the engine's {tensor['shape']}")
        if -1 in tensor["shape"]:
            low, _, high = self._engine._image.profile[name]
            if any(not lo <= d <= hi for lo, d, hi in zip(low, dims, high, strict=True)):
                return self._error(f"setInputShape: {name} {dims} is outside the profile {low}..{high}")
        self._shapes[name] = dims
        self._addresses.clear()  # addresses are set again after shapes change: the order checked
        self.calls.append(f"set_input_shape {name}")
        return True

    def get_tensor_shape(self, name: str) -> Dims:
        tensor = self._engine._tensor(name)
        if tensor["mode"] == "INPUT":
            return Dims(self._input_shape(tensor) or tensor["shape"])
        shapes = {t["name"]: self._input_shape(t) for t in self._inputs()}
        if any(s is None for s in shapes.values()):
            return Dims([-1] * len(tensor["shape"]))
        names = [t["name"] for t in self._engine._image.tensors if t["mode"] == "OUTPUT"]
        found = self._engine._executor.output_shapes({k: tuple(v) for k, v in shapes.items() if v is not None})
        return Dims(list(found[names.index(name)]))

    def set_tensor_address(self, name: str, memory: int) -> bool:
        self._engine._tensor(name)
        if not isinstance(memory, int) or memory <= 0:
            return self._error(f"setTensorAddress: {name} needs a device pointer, got {memory!r}")
        missing = [t["name"] for t in self._inputs() if self._input_shape(t) is None]
        if missing:
            return self._error(f"setTensorAddress({name}) before the input shapes of {missing} were set")
        self._addresses[name] = memory
        self.calls.append(f"set_tensor_address {name}")
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        if not isinstance(stream_handle, int):
            return self._error(f"executeAsyncV3: stream handle must be an int, got {type(stream_handle).__name__}")
        tensors = self._engine._image.tensors
        missing = [t["name"] for t in tensors if t["name"] not in self._addresses]
        if missing:
            return self._error(f"executeAsyncV3: no address set for {missing} since the input shapes changed")
        device = _double.device
        if device is None:
            return self._error("executeAsyncV3: no CUDA device")
        inputs = {
            t["name"]: (tuple(self._input_shape(t) or ()), np.dtype(nptype(DataType[t["dtype"]])))
            for t in self._inputs()
        }
        outputs = [t for t in tensors if t["mode"] == "OUTPUT"]
        addresses = dict(self._addresses)
        executor = self._engine._executor

        def run() -> None:
            feed = {
                name: np.frombuffer(
                    device.read(addresses[name], _double.volume(shape) * dtype.itemsize), dtype
                ).reshape(shape)
                for name, (shape, dtype) in inputs.items()
            }
            for tensor, value in zip(outputs, executor.run(feed), strict=True):
                value = value.astype(nptype(DataType[tensor["dtype"]]), copy=False)
                device.write(addresses[tensor["name"]], value.tobytes())

        device.enqueue(stream_handle, run)
        self.calls.append("execute_async_v3")
        return True
