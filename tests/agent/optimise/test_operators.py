"""`agent.optimise.operators`: the operator table and its warnings on a dynamically quantized COCO model."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.optimise.hygiene import check_model, describe
from agent.optimise.operators import unsupported_operators


@pytest.mark.models
def test_operator_warnings_on_a_dynamically_quantized_coco_model(shared_models: Path) -> None:
    """ORT's dynamic quantization (ConvInteger, DynamicQuantizeLinear): TensorRT cannot parse it."""
    facts = describe(check_model(shared_models / "yolov8n_int8_640.onnx"))
    warnings = {w.target: w.operators for w in facts.warnings}
    assert {"ConvInteger", "DynamicQuantizeLinear"} <= set(warnings["tensorrt"])
    assert "ConvInteger" in warnings["litert"] and "DynamicQuantizeLinear" not in warnings["litert"]
    assert facts.precision == "int8"


@pytest.mark.parametrize(
    ("nodes", "opset", "expected"),
    [
        ([("", "Conv"), ("", "Sigmoid")], 17, []),
        ([("", "Conv"), ("", "NonZero")], 17, []),
        ([("", "Unique")], 17, ["tensorrt: Unique"]),
        ([("", "GridSample")], 17, ["litert: GridSample"]),
        ([("", "Conv")], 21, ["tensorrt: opset 21"]),
        (
            [("com.microsoft", "FusedConv")],
            17,
            ["tensorrt: com.microsoft:FusedConv", "litert: com.microsoft:FusedConv"],
        ),
    ],
)
def test_operator_table(nodes: list[tuple[str, str]], opset: int, expected: list[str]) -> None:
    found = [f"{w.target}: {', '.join(w.operators)}" for w in unsupported_operators(nodes, opset)]
    assert found == expected
