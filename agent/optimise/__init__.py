"""The operator's build tools: model hygiene, FP16 / INT8 variants and their proof against FP32,
for `edge-agent bundle build` (docs/optimising.md). Needs the ``build`` extra (onnx, onnxslim,
sympy); the device never imports this room. This file imports only the standard library, so the
CLI can name the choices without loading the tooling."""

from __future__ import annotations

import importlib.util
from typing import Literal, get_args

#: how ONNX Runtime's static quantization finds activation ranges (`bundle build --calibration-method`)
CalibrationMethod = Literal["minmax", "entropy", "percentile"]
CALIBRATION_METHODS: tuple[CalibrationMethod, ...] = get_args(CalibrationMethod)
#: INT8 activations: symmetric (zero point 0, what TensorRT takes) or asymmetric (ONNX Runtime and
#: LiteRT only; better for models whose activations are mostly positive: YOLOX)
Activations = Literal["symmetric", "asymmetric"]
ACTIVATIONS: tuple[Activations, ...] = get_args(Activations)
#: the modules the ``build`` extra brings (ONNX Runtime's quantizer needs sympy)
BUILD_MODULES = ("onnx", "onnxslim", "sympy")


def missing_tools() -> list[str]:
    """The modules of the ``build`` extra that are not installed here."""
    return [name for name in BUILD_MODULES if importlib.util.find_spec(name) is None]
