"""Test double of the TensorRT 10 Python API subset edge-agent uses (TensorRT cannot be
installed here). Put ``tests/fakes/tensorrt_double`` first on ``sys.path`` and ``import
tensorrt`` finds it (tests/trt_double.py does this).

Strict the way TensorRT 10 is: objects take no unknown attributes (``max_workspace_size`` fails),
what TensorRT 10 removed does not exist (``Builder.build_engine``, binding indices, ``execute_v2``
and ``execute_async_v2``), profile shapes must be `Dims`, and an execution context checks the
call order of one inference: input shapes set before tensor addresses, every address set before
``execute_async_v3``. Names and parameters follow TensorRT 10.13's published stubs (a test
compares them). The parser refuses the operators TensorRT does not support (`_double.UNSUPPORTED_OPS`)
with one error per node; engines compute with ONNX Runtime (see `_double`).
"""

from __future__ import annotations

import enum
import json
from typing import Any

import numpy as np

from . import _double

__version__ = _double.VERSION


class _Strict:
    """pybind objects refuse attributes they do not define."""

    __slots__ = ()


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    INT64 = 8


_DTYPES = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "BOOL": np.bool_}
_DTYPES.update({"UINT8": np.uint8, "INT64": np.int64})
_ONNX_TYPES = {1: "FLOAT", 10: "HALF", 3: "INT8", 6: "INT32", 9: "BOOL", 2: "UINT8", 7: "INT64"}


def nptype(trt_type: DataType) -> type:
    return _DTYPES[trt_type.name]


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0
    DLA_MANAGED_SRAM = 1


class BuilderFlag(enum.Enum):
    FP16 = 0
    INT8 = 1
    DEBUG = 2


class LayerType(enum.Enum):
    CONVOLUTION = 0
    ACTIVATION = 2
    ELEMENTWISE = 9
    REDUCE = 14
    QUANTIZE = 32
    DEQUANTIZE = 33


class ErrorCode(enum.Enum):
    SUCCESS = 0
    INTERNAL_ERROR = 1
    INVALID_GRAPH = 5
    INVALID_NODE = 6
    UNSUPPORTED_NODE = 8


class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    def __init__(self) -> None:
        pass

    def log(self, severity: ILogger.Severity, msg: str) -> None:
        raise NotImplementedError("an ILogger subclass implements log")


class Logger(ILogger):
    def __init__(self, min_severity: ILogger.Severity = ILogger.Severity.WARNING) -> None:
        self.min_severity = min_severity

    def log(self, severity: ILogger.Severity, msg: str) -> None:
        if severity <= self.min_severity:
            print(f"[TRT] {msg}")


class Dims:
    __slots__ = ("_shape",)

    def __init__(self, shape: list[int]) -> None:
        self._shape = [int(d) for d in shape]

    def __len__(self) -> int:
        return len(self._shape)

    def __getitem__(self, index: int) -> int:
        return self._shape[index]

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (Dims, list, tuple)) else NotImplemented

    def __repr__(self) -> str:
        return f"({', '.join(map(str, self._shape))})"


def _shape(value: Any, what: str) -> list[int]:
    if not isinstance(value, (Dims, list, tuple)):
        raise TypeError(f"{what}: expected Dims, got {type(value).__name__}")
    return [int(d) for d in value]


class ITensor(_Strict):
    __slots__ = ("dtype", "is_network_input", "is_network_output", "name", "shape")

    def __init__(self, name: str, shape: list[int], dtype: DataType, is_input: bool) -> None:
        self.name, self.shape, self.dtype = name, Dims(shape), dtype
        self.is_network_input, self.is_network_output = is_input, not is_input


class ILayer(_Strict):
    __slots__ = ("name", "type")

    def __init__(self, name: str, kind: LayerType) -> None:
        self.name, self.type = name, kind


class INetworkDefinition(_Strict):
    __slots__ = ("_inputs", "_layers", "_outputs", "onnx")

    def __init__(self) -> None:
        self._inputs: list[ITensor] = []
        self._outputs: list[ITensor] = []
        self._layers: list[ILayer] = []
        self.onnx = b""

    num_inputs = property(lambda self: len(self._inputs))
    num_outputs = property(lambda self: len(self._outputs))
    num_layers = property(lambda self: len(self._layers))

    def get_input(self, index: int) -> ITensor:
        return self._inputs[index]

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]

    def get_layer(self, index: int) -> ILayer:
        return self._layers[index]


class ParserError(_Strict):
    __slots__ = ("_code", "_desc", "_name", "_node", "_op")

    def __init__(self, code: ErrorCode, desc: str, node: int = -1, name: str = "", op: str = "") -> None:
        self._code, self._desc, self._node, self._name, self._op = code, desc, node, name, op

    def code(self) -> ErrorCode:
        return self._code

    def desc(self) -> str:
        return self._desc

    def node(self) -> int:
        return self._node

    def node_name(self) -> str:
        return self._name

    def node_operator(self) -> str:
        return self._op

    def file(self) -> str:
        return "ModelImporter.cpp"

    def line(self) -> int:
        return 0

    def func(self) -> str:
        return "parseGraph"


class OnnxParser(_Strict):
    __slots__ = ("_errors", "_logger", "_network")

    def __init__(self, network: INetworkDefinition, logger: ILogger) -> None:
        self._network, self._logger, self._errors = network, logger, []

    num_errors = property(lambda self: len(self._errors))

    def get_error(self, index: int) -> ParserError:
        return self._errors[index]

    def clear_errors(self) -> None:
        self._errors.clear()

    def parse_from_file(self, model: str) -> bool:
        try:
            with open(model, "rb") as f:
                data = f.read()
        except OSError as exc:
            self._errors.append(ParserError(ErrorCode.INTERNAL_ERROR, f"Failed to open {model}: {exc}"))
            return False
        return self.parse(data, model)

    def parse(self, model: bytes, path: str | None = None) -> bool:
        import onnx

        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as exc:
            self._errors.append(ParserError(ErrorCode.INVALID_GRAPH, f"Failed to parse ONNX model: {exc}"))
            return False
        for index, node in enumerate(proto.graph.node):
            if node.op_type in _double.UNSUPPORTED_OPS:
                desc = f"No importer registered for op: {node.op_type}."
                self._errors.append(ParserError(ErrorCode.UNSUPPORTED_NODE, desc, index, node.name, node.op_type))
        if self._errors:
            return False
        initializers = {i.name for i in proto.graph.initializer}
        network = self._network
        for value, is_input in [(v, True) for v in proto.graph.input if v.name not in initializers] + [
            (v, False) for v in proto.graph.output
        ]:
            tensor_type = value.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
            dtype = DataType[_ONNX_TYPES.get(tensor_type.elem_type, "FLOAT")]
            (network._inputs if is_input else network._outputs).append(ITensor(value.name, dims, dtype, is_input))
        kinds = {"QuantizeLinear": LayerType.QUANTIZE, "DequantizeLinear": LayerType.DEQUANTIZE}
        kinds.update({"Conv": LayerType.CONVOLUTION, "Sigmoid": LayerType.ACTIVATION, "ReduceSum": LayerType.REDUCE})
        network._layers = [ILayer(n.name, kinds.get(n.op_type, LayerType.ELEMENTWISE)) for n in proto.graph.node]
        network.onnx = bytes(model)
        return True


class IOptimizationProfile(_Strict):
    __slots__ = ("shapes",)

    def __init__(self) -> None:
        self.shapes: dict[str, list[list[int]]] = {}

    def set_shape(self, input: str, min: Dims, opt: Dims, max: Dims) -> None:
        for what, value in (("min", min), ("opt", opt), ("max", max)):
            if not isinstance(value, Dims):
                raise TypeError(f"set_shape({input!r}): {what} must be Dims, got {type(value).__name__}")
        self.shapes[input] = [list(min), list(opt), list(max)]

    def get_shape(self, input: str) -> list[Dims]:
        return [Dims(s) for s in self.shapes[input]]


class IHostMemory(bytes):
    @property
    def nbytes(self) -> int:
        return len(self)


class ITimingCache(_Strict):
    __slots__ = ("entries",)

    def __init__(self, entries: list[str]) -> None:
        self.entries = entries

    def serialize(self) -> IHostMemory:
        return IHostMemory(json.dumps(self.entries).encode())

    def combine(self, input_cache: ITimingCache, ignore_mismatch: bool) -> bool:
        self.entries += [e for e in input_cache.entries if e not in self.entries]
        return True

    def reset(self) -> bool:
        self.entries.clear()
        return True


class IInt8Calibrator:
    def __init__(self) -> None:
        pass

    def get_batch_size(self) -> int:
        raise NotImplementedError

    def get_batch(self, names: list[str]) -> list[int]:
        raise NotImplementedError

    def read_calibration_cache(self) -> bytes:
        raise NotImplementedError

    def write_calibration_cache(self, cache: bytes) -> None:
        raise NotImplementedError


class IInt8EntropyCalibrator2(IInt8Calibrator):
    pass


class IProgressMonitor:
    def __init__(self) -> None:
        pass

    def phase_start(self, phase_name: str, parent_phase: str, num_steps: int) -> None:
        raise NotImplementedError

    def step_complete(self, phase_name: str, step: int) -> bool:
        raise NotImplementedError

    def phase_finish(self, phase_name: str) -> None:
        raise NotImplementedError


from ._builder import Builder, IBuilderConfig  # noqa: E402
from ._runtime import ICudaEngine, IExecutionContext, Runtime  # noqa: E402

__all__ = [
    "Builder",
    "BuilderFlag",
    "DataType",
    "Dims",
    "ErrorCode",
    "IBuilderConfig",
    "ICudaEngine",
    "IExecutionContext",
    "IHostMemory",
    "IInt8Calibrator",
    "IInt8EntropyCalibrator2",
    "ILayer",
    "ILogger",
    "INetworkDefinition",
    "IOptimizationProfile",
    "IProgressMonitor",
    "ITensor",
    "ITimingCache",
    "LayerType",
    "Logger",
    "MemoryPoolType",
    "OnnxParser",
    "ParserError",
    "Runtime",
    "TensorIOMode",
    "nptype",
]
