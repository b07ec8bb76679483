"""Model hygiene at build time: every ONNX artifact is checked, described and simplified before it
goes into a bundle (docs/optimising.md).

- `check_model`: ``onnx.checker`` (full check) and strict shape inference; a model that fails
  either refuses the build with the checker's own message (``MODEL_CHECK_FAILED``).
- `describe`: opset, IR version, producer, dynamic axes, precision, and the operators TensorRT 10
  or the LiteRT converter cannot take (`agent.optimise.operators`, a warning).
- `simplify`: onnxslim, kept only when the simplified model's outputs are identical (bit for bit)
  to the original's on the reference input; otherwise the model ships as given, and says why.

Runs on the operator's machine in the calling thread; needs the ``build`` extra (onnx, onnxslim).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx

from agent.errors import BundleError, ErrorCode
from agent.optimise.operators import OperatorWarning, unsupported_operators
from runtimes.base import Precision

#: operators that make a graph an integer-quantized one
_INT8_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger"}
    | {"DynamicQuantizeLinear"}
)


@dataclass(frozen=True)
class DynamicAxis:
    """An input or output axis without a fixed size: `axis` of tensor `tensor`, named `name`
    (``dim_param``; empty when the export left it unnamed)."""

    tensor: str
    axis: int
    name: str

    def __str__(self) -> str:
        return f"{self.tensor}[{self.axis}]={self.name or '?'}"


@dataclass(frozen=True)
class Facts:
    """What `describe` found in one ONNX model."""

    opset: int  # of the default domain
    ir_version: int
    producer: str  # "pytorch 2.4", or "" when the file names none
    nodes: int  # in the main graph
    precision: Precision
    dynamic_axes: tuple[DynamicAxis, ...]
    warnings: tuple[OperatorWarning, ...]

    def summary(self) -> str:
        """One line: ``opset 17, IR 8, fp32, 73 nodes, dynamic axes images[0]=batch``."""
        axes = ", ".join(map(str, self.dynamic_axes)) or "none"
        producer = f", from {self.producer}" if self.producer else ""
        return (
            f"opset {self.opset}, IR {self.ir_version}, {self.precision}, {self.nodes} nodes{producer}, "
            f"dynamic axes {axes}"
        )


@dataclass(frozen=True)
class Simplified:
    """The model to ship and what simplification did: `path` is the simplified file when it was
    kept, else the original; `note` says which and why."""

    path: Path
    kept: bool
    note: str


def check_model(path: Path) -> onnx.ModelProto:
    """Load `path` and run ``onnx.checker`` (full check) and strict shape inference on it.

    Raises `BundleError` ``MODEL_CHECK_FAILED`` naming the file and the checker's message.
    """
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf's DecodeError, or an OSError: not an ONNX file
        raise BundleError(ErrorCode.MODEL_CHECK_FAILED, f"{path.name} is not an ONNX model: {exc}") from exc
    check_loaded(model, path.name)
    return model


def check_loaded(model: onnx.ModelProto, name: str) -> None:
    """`check_model` for a model already in memory (a variant just made); `name` labels errors."""
    try:
        onnx.checker.check_model(model, full_check=True)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        message = " ".join(str(exc).split())
        raise BundleError(ErrorCode.MODEL_CHECK_FAILED, f"{name}: the ONNX checker refused it: {message}") from exc


def _nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of `graph` and of its subgraphs (If, Loop, Scan bodies)."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _nodes(attribute.g)
            for sub in attribute.graphs:
                yield from _nodes(sub)


def _dynamic_axes(values: Sequence[onnx.ValueInfoProto]) -> list[DynamicAxis]:
    found = []
    for value in values:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value"):
                found.append(DynamicAxis(value.name, axis, dim.dim_param))
    return found


def model_precision(model: onnx.ModelProto) -> Precision:
    """int8 with quantized operators in the graph, fp16 with FP16 weights, else fp32."""
    if any(node.op_type in _INT8_OPS for node in _nodes(model.graph)):
        return "int8"
    if any(init.data_type == onnx.TensorProto.FLOAT16 for init in model.graph.initializer):
        return "fp16"
    return "fp32"


def describe(model: onnx.ModelProto) -> Facts:
    """The facts of a checked model (pure: no file or runtime)."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    initializers = {init.name for init in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in initializers]
    nodes = ((node.domain, node.op_type) for node in _nodes(model.graph))
    producer = " ".join(filter(None, (model.producer_name, model.producer_version)))
    return Facts(
        opset=opset,
        ir_version=model.ir_version,
        producer=producer,
        nodes=len(model.graph.node),
        precision=model_precision(model),
        dynamic_axes=tuple(_dynamic_axes([*inputs, *model.graph.output])),
        warnings=tuple(unsupported_operators(nodes, opset)),
    )


def _outputs(path: Path, tensor: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
    """Raw outputs of the model at `path` on `tensor`, by ONNX Runtime on the CPU."""
    from runtimes.registry import load_runtime

    with load_runtime("onnxruntime", path, warmup=False) as runtime:
        return runtime.infer([tensor])


def simplify(model: onnx.ModelProto, source: Path, target: Path, tensor: npt.NDArray[Any]) -> Simplified:
    """Simplify `model` (loaded from `source`) with onnxslim into `target`; keep the result only
    when its outputs equal the original's exactly on the reference input `tensor`."""
    import onnxslim

    try:
        slim = onnxslim.slim(model)
    except Exception as exc:  # onnxslim's own errors have no common base class
        return Simplified(source, False, f"kept as given: onnxslim failed ({type(exc).__name__}: {exc})")
    if not isinstance(slim, onnx.ModelProto):
        return Simplified(source, False, "kept as given: onnxslim returned no model")
    check_loaded(slim, f"{source.name} simplified")
    before, after = len(model.graph.node), len(slim.graph.node)
    if after >= before and len(slim.graph.initializer) >= len(model.graph.initializer):
        return Simplified(source, False, f"kept as given: already simple ({before} node{'s' * (before != 1)})")
    onnx.save(slim, str(target))
    expected, got = _outputs(source, tensor), _outputs(target, tensor)
    same = len(expected) == len(got) and all(
        a.shape == b.shape and np.array_equal(a, b) for a, b in zip(expected, got, strict=False)
    )
    if not same:
        target.unlink()
        worst = max(
            (float(np.abs(a - b).max()) for a, b in zip(expected, got, strict=False) if a.shape == b.shape),
            default=float("inf"),
        )
        return Simplified(
            source, False, f"kept as given: the simplified model's outputs differ (max |difference| {worst:.3g})"
        )
    return Simplified(target, True, f"simplified by onnxslim: {before} -> {after} nodes, outputs identical")
