"""INT8 the OpenVINO way: NNCF's post-training quantization of an FP32 ONNX model into an OpenVINO
IR (``model.xml`` + ``model.bin``), for `bundle build --openvino-int8` (docs/openvino.md).

`quantize_openvino` reads the ONNX model with OpenVINO, calibrates it with ``nncf.quantize`` on
tensors the caller preprocessed the way the pipeline does (preset MIXED: symmetric weights,
asymmetric activations), leaves the head's decode in float as Ultralytics' own OpenVINO INT8
export does (`FLOAT_TYPES`: multiplications, subtractions, sigmoids, softmax), and writes the
IR with FP32 weights where they stay float. The ONNX metadata (``names``, ``imgsz``, ``stride``,
``task``) travels in the IR's ``rt_info``, where `runtimes.openvino_backend` reads it.

Needs NNCF and OpenVINO (``pip install 'edge-agent[nncf]'``); runs in the calling thread on
the operator's machine, never on the device.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy.typing as npt

#: OpenVINO operation types left in float: the head's decode (DFL softmax, sigmoid scores,
#: scaling to pixels), whose outputs mix pixel coordinates with 0..1 scores
FLOAT_TYPES = ("Multiply", "Subtract", "Sigmoid", "Softmax")
#: what the ``nncf`` extra brings
MODULES = ("nncf", "openvino")


def missing_tools() -> list[str]:
    """The modules `quantize_openvino` needs that are not installed here."""
    return [name for name in MODULES if importlib.util.find_spec(name) is None]


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """`logger` at ERROR inside the block, at its own level again after it."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def quantize_openvino(source: Path, target: Path, tensors: Sequence[npt.NDArray[Any]]) -> Path:
    """Quantize the FP32 ONNX model at `source` into an INT8 OpenVINO IR at `target` (a ``.xml``;
    its weights go to the ``.bin`` of the same name), calibrated on the preprocessed `tensors`
    (each one input, ``(1, 3, H, W) float32``). Returns the weights' path. Raises ``ValueError``
    without tensors or for a target that is not an ``.xml``; NNCF's and OpenVINO's own errors
    otherwise (the caller reports them)."""
    if not tensors:
        raise ValueError("INT8 calibration needs at least one tensor")
    if target.suffix != ".xml":
        raise ValueError(f"an OpenVINO IR is written to a .xml file, not {target.name}")
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(source))
    # NNCF's progress bars (stdout) and its lines per ignored node (its logger), for this call only;
    # not nncf.set_log_level, which also sets the level of every handler on its logger
    with contextlib.redirect_stdout(io.StringIO()), _quiet(logging.getLogger("nncf")):
        quantized = nncf.quantize(
            model,
            nncf.Dataset(list(tensors)),
            subset_size=len(tensors),
            preset=nncf.QuantizationPreset.MIXED,
            ignored_scope=nncf.IgnoredScope(types=list(FLOAT_TYPES), validate=False),
        )
    ov.save_model(quantized, str(target), compress_to_fp16=False)
    return target.with_suffix(".bin")
