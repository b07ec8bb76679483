"""Making the FP16 and INT8 variants of an FP32 ONNX model (docs/optimising.md).

- `to_fp16`: ONNX Runtime's float16 converter (``onnxruntime.transformers.float16``, the code
  onnxconverter-common also ships) with the inputs and outputs kept FP32, so every runtime and
  our preprocessing feed it as they feed the FP32 model; nodes sorted again afterwards (the
  converter appends its input casts at the end, which the checker refuses).
- `quantize_qdq`: ONNX Runtime's static quantization into Q/DQ form: per-channel symmetric INT8
  weights; activations symmetric INT8 (zero point 0, as TensorRT wants; the default) or
  asymmetric UINT8; calibrated on tensors the caller preprocessed the way the pipeline does;
  MinMax, Entropy or Percentile. Models below opset 13 are converted to it first (per-channel
  Q/DQ needs it). `COMPUTE_OPS` limits it to the convolutions and matrix products, leaving the
  head's decode in float (`bundle build` tries that when the whole model fails its gate:
  docs/optimising.md).

Both copy the source's metadata (``names``, ``imgsz``, ``stride``) and pass the checker. Runs
in the calling thread on the operator's machine; needs the ``build`` extra.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt
import onnx

from agent.optimise import Activations, CalibrationMethod
from agent.optimise.hygiene import check_loaded

log = logging.getLogger(__name__)


def set_metadata(model: onnx.ModelProto, metadata: dict[str, str]) -> None:
    """Replace `model`'s metadata properties with `metadata`."""
    del model.metadata_props[:]
    for key, value in metadata.items():
        model.metadata_props.add(key=key, value=value)


def metadata_of(model: onnx.ModelProto) -> dict[str, str]:
    return {prop.key: prop.value for prop in model.metadata_props}


def drop_unused_opsets(model: onnx.ModelProto) -> None:
    """Keep only the opset imports that the graph's nodes use (and the default domain). ONNX
    Runtime's quantizer stamps every domain it knows at its own versions (``ai.onnx.ml`` 5 from
    1.32), and an older runtime refuses a model that names an opset newer than it knows, used or
    not: ONNX Runtime 1.17 (JetPack 6, our lower bound) refused the QDQ model for it."""
    used = {node.domain for node in model.graph.node} | {""}
    keep = [opset for opset in model.opset_import if opset.domain in used]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """An FP16 copy of the FP32 `model` with FP32 inputs and outputs."""
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    half = convert_float_to_float16(model, keep_io_types=True)
    sorted_model = OnnxModel(half)
    sorted_model.topological_sort()
    result: onnx.ModelProto = sorted_model.model
    set_metadata(result, metadata_of(model))
    check_loaded(result, "the FP16 variant")
    return result


#: per-channel Q/DQ needs the ``axis`` attribute of QuantizeLinear / DequantizeLinear (opset 13)
QDQ_MIN_OPSET = 13


def _at_least_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """`model` itself when its default-domain opset is `opset` or newer, else a converted copy
    (``onnx.version_converter``; YOLOX exports are opset 11)."""
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), opset)
    if current >= opset:
        return model
    from onnx import version_converter

    converted: onnx.ModelProto = version_converter.convert_version(model, opset)
    return converted


class _Tensors:
    """ONNX Runtime's calibration data reader over preprocessed tensors: ``{input: tensor}`` each."""

    def __init__(self, input_name: str, tensors: Sequence[npt.NDArray[Any]]) -> None:
        self._feeds = iter([{input_name: t} for t in tensors])

    def get_next(self) -> dict[str, npt.NDArray[Any]] | None:
        return next(self._feeds, None)


#: the operators that carry a YOLO network's arithmetic; quantizing only these keeps the rest
#: (the head's sigmoid, DFL softmax, concatenations and scaling to pixels) in float
COMPUTE_OPS = ("Conv", "MatMul", "Gemm")


def quantize_qdq(
    source: Path,
    target: Path,
    input_name: str,
    tensors: Sequence[npt.NDArray[Any]],
    method: CalibrationMethod = "minmax",
    activations: Activations = "symmetric",
    op_types: Sequence[str] = (),
) -> onnx.ModelProto:
    """Quantize the FP32 model at `source` into an INT8 Q/DQ model at `target`, calibrated on
    `tensors` (each fed to the input `input_name`): weights per channel, symmetric INT8;
    activations symmetric INT8 or asymmetric UINT8; only the `op_types` given (e.g.
    `COMPUTE_OPS`), else every operator ONNX Runtime can quantize. Returns the model written
    (metadata copied, unused opsets dropped, checked). Raises ``ValueError`` without tensors."""
    from onnxruntime.quantization import CalibrationMethod as OrtMethod
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if not tensors:
        raise ValueError("INT8 calibration needs at least one tensor")
    methods = {"minmax": OrtMethod.MinMax, "entropy": OrtMethod.Entropy, "percentile": OrtMethod.Percentile}
    original = onnx.load(str(source))
    prepared = target.with_name(target.stem + ".prep.onnx")
    upgraded = _at_least_opset(original, QDQ_MIN_OPSET)
    if upgraded is not original:
        onnx.save(upgraded, str(prepared))
        source = prepared
    try:
        quant_pre_process(str(source), str(prepared))
    except Exception as exc:  # symbolic shape inference gives up on some graphs: quantize as it is
        log.warning("quantization pre-processing failed on %s (%s): quantizing it as it is", source.name, exc)
        onnx.save(upgraded, str(prepared))
    try:
        # the entropy and percentile calibrators print their progress: keep the CLI's output clean
        with contextlib.redirect_stdout(io.StringIO()):
            quantize_static(
                str(prepared),
                str(target),
                _Tensors(input_name, tensors),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                activation_type=QuantType.QInt8 if activations == "symmetric" else QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=methods[method],
                op_types_to_quantize=list(op_types) or None,
                # no CalibMaxIntermediateOutputs: ONNX Runtime 1.32's MinMax calibrator drops the
                # batches it should fold in when that limit is reached ("No data is collected")
                extra_options={"ActivationSymmetric": activations == "symmetric", "WeightSymmetric": True},
            )
    finally:
        prepared.unlink(missing_ok=True)
    model = onnx.load(str(target))
    drop_unused_opsets(model)
    set_metadata(model, metadata_of(original))
    check_loaded(model, "the INT8 variant")
    onnx.save(model, str(target))
    return model
