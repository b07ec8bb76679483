"""`agent.optimise.nncf_int8`: NNCF's INT8 OpenVINO IR of the demo detector: written as .xml +
.bin, the network quantized and the head's decode left in float, its metadata kept, its
detections those of the FP32 model; bad arguments and missing tools named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS

from agent.optimise import nncf_int8
from agent.optimise.agreement import measure
from agent.optimise.nncf_int8 import FLOAT_TYPES, missing_tools, quantize_openvino
from pipelines.decoding.detector import Detector
from pipelines.sources.synthetic import SyntheticScene
from runtimes.registry import load_runtime

pytest.importorskip("nncf", reason="the nncf extra is not installed")
ov = pytest.importorskip("openvino", reason="the openvino extra is not installed")

FP32 = DEMO_MODELS / "demo_detector.onnx"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[np.ndarray]]:
    """The IR, its weights, and validation frames (other scenes than the calibration's)."""
    baseline = Detector(load_runtime("onnxruntime", FP32))
    calibration = [baseline.prepare(SyntheticScene(seed=40 + i, num_shapes=5).render(i)[0])[0] for i in range(8)]
    target = tmp_path_factory.mktemp("nncf") / "demo_int8.xml"
    weights = quantize_openvino(FP32, target, calibration)
    frames = [SyntheticScene(seed=90 + i, num_shapes=5).render(2 * i)[0] for i in range(8)]
    return target, weights, frames


def test_the_ir_and_its_weights_are_written(quantized) -> None:
    target, weights, _ = quantized
    assert weights == target.with_suffix(".bin") and weights.stat().st_size > 100_000
    assert weights.stat().st_size < FP32.stat().st_size / 2, "INT8 weights: well under the FP32 model's size"


def test_the_network_is_quantized_and_the_head_s_decode_stays_float(quantized) -> None:
    model = ov.Core().read_model(str(quantized[0]))
    ops = model.get_ordered_ops()
    assert sum(op.get_type_name() == "FakeQuantize" for op in ops) >= 10
    convolutions = [op for op in ops if op.get_type_name() == "Convolution"]
    fed_quantized = [op for op in convolutions if _producer(op, 0) == "FakeQuantize"]
    assert len(fed_quantized) >= 0.9 * len(convolutions)
    decode = [op for op in ops if op.get_type_name() in FLOAT_TYPES]
    assert decode, "the demo detector's head has sigmoids, a softmax and multiplications"
    assert not [op.get_friendly_name() for op in decode if "FakeQuantize" in _producers(op)]


def _producer(op, index: int) -> str:
    return str(op.input_value(index).get_node().get_type_name())


def _producers(op) -> set[str]:
    return {_producer(op, i) for i in range(op.get_input_size())}


def test_the_ir_keeps_the_metadata_and_the_fp32_detections(quantized) -> None:
    target, _, frames = quantized
    with load_runtime("onnxruntime", FP32) as fp32, load_runtime("openvino", target) as int8:
        assert int8.metadata.names == fp32.metadata.names and int8.metadata.imgsz == fp32.metadata.imgsz
        measured = measure(Detector(fp32), Detector(int8), frames)
    assert measured.baseline_detections >= 20
    assert measured.agreement is not None and measured.agreement >= 0.95, measured
    assert 0 < measured.max_abs_error < 1.0, "quantized (not a copy), and close"


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs at least one tensor"):
        quantize_openvino(FP32, tmp_path / "m.xml", [])
    with pytest.raises(ValueError, match=r"written to a \.xml file, not m\.onnx"):
        quantize_openvino(FP32, tmp_path / "m.onnx", [np.zeros((1, 3, 320, 320), np.float32)])


def test_missing_tools_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert missing_tools() == []
    monkeypatch.setattr(nncf_int8.importlib.util, "find_spec", lambda name: None if name == "nncf" else object())
    assert missing_tools() == ["nncf"]


def test_quantizing_leaves_the_logging_of_this_process_as_it_was(quantized) -> None:
    """NNCF is quiet during the call only; no handler of the process is changed (nncf.set_log_level
    would set every handler on its logger, pytest's included, to ERROR)."""
    import logging

    nncf_logger = logging.getLogger("nncf")
    assert nncf_logger.level != logging.ERROR
    assert all(handler.level < logging.ERROR for handler in nncf_logger.handlers + logging.getLogger().handlers)
