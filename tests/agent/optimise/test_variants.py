"""`agent.optimise.variants`: each calibration method reaches the quantizer."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper
from testkit import DEMO_MODELS

from agent.optimise.variants import quantize_qdq
from pipelines.decoding.detector import Detector
from pipelines.sources.synthetic import SyntheticScene
from runtimes.registry import load_runtime

FP32 = DEMO_MODELS / "demo_detector.onnx"


def _activation_scales(model: onnx.ModelProto) -> dict[str, float]:
    """The per-tensor (activation) scales of a Q/DQ model, by initializer name."""
    arrays = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    return {name: float(a) for name, a in arrays.items() if name.endswith("_scale") and a.size == 1}


@pytest.mark.slow
def test_each_calibration_method_reaches_the_quantizer(tmp_path: Path) -> None:
    """minmax, entropy and percentile each give a checked Q/DQ model; percentile clips the ranges
    minmax takes whole (ONNX Runtime's entropy search, at its default 128 bins, may end at the
    whole range too: docs/optimising.md)."""
    with load_runtime("onnxruntime", FP32) as runtime:
        detector = Detector(runtime)
        frames = [SyntheticScene(seed=7_200 + i, num_shapes=5).render(0)[0] for i in range(4)]
        tensors = [detector.prepare(frame)[0] for frame in frames]
        name = runtime.inputs[0].name
    scales = {}
    for method in ("minmax", "entropy", "percentile"):
        model = quantize_qdq(FP32, tmp_path / f"{method}.onnx", name, tensors, method)
        assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in model.graph.node}
        scales[method] = _activation_scales(model)
    assert scales["minmax"].keys() == scales["percentile"].keys() and len(scales["minmax"]) >= 20
    clipped = [k for k, v in scales["percentile"].items() if v < scales["minmax"][k] * (1 - 1e-6)]
    assert len(clipped) >= len(scales["minmax"]) // 2, clipped
    assert all(scales["entropy"][k] <= v * (1 + 1e-6) for k, v in scales["minmax"].items())
