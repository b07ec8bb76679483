"""`agent.optimise.hygiene`: the checker and strict shape inference refuse with their messages, describe,
lossless simplification only."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from testkit import DEMO_MODELS
from testkit.optimise import _build

from agent.errors import BundleError, ErrorCode
from agent.optimise.hygiene import check_model, describe, simplify
from runtimes.registry import load_runtime


def _save_model(path: Path, nodes: list, initializers: tuple = (), shape: tuple = (1, 3, 32, 32)) -> Path:
    """Write a graph of `nodes` from ``images`` to ``output0`` (both float `shape`), unchecked;
    IR 8, which every supported ONNX Runtime (1.17 on) loads."""
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, list(shape))],
        list(initializers),
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def _broken_model(path: Path) -> Path:
    """A model whose Add reads a tensor no node makes: the checker refuses it."""
    return _save_model(path, [helper.make_node("Add", ["images", "nowhere"], ["output0"])])


def test_a_model_the_checker_refuses_is_refused_with_its_message(tmp_path: Path, scenes: Path, capsys) -> None:
    broken = _broken_model(tmp_path / "broken.onnx")
    with pytest.raises(onnx.checker.ValidationError) as checker:
        onnx.checker.check_model(onnx.load(str(broken)), full_check=True)
    expected = " ".join(str(checker.value).split())
    for extra in ([], ["--precisions", "fp32,fp16", "--calibration", scenes]):
        status, _, err = _build(capsys, "--model", broken, *extra, "-o", tmp_path / "x.bundle")
        assert status == 1
        assert err.startswith("edge-agent: error: MODEL_CHECK_FAILED: broken.onnx: the ONNX checker refused it:")
        assert expected in err
        assert not (tmp_path / "x.bundle").exists()


def test_strict_shape_inference_refuses_inconsistent_shapes(tmp_path: Path) -> None:
    bias = numpy_helper.from_array(np.zeros((5, 7), np.float32), "bias")
    path = _save_model(
        tmp_path / "inconsistent.onnx", [helper.make_node("Add", ["images", "bias"], ["output0"])], (bias,)
    )
    with pytest.raises(BundleError) as refused:
        check_model(path)
    assert refused.value.code == ErrorCode.MODEL_CHECK_FAILED and "inconsistent.onnx" in refused.value.message
    (tmp_path / "junk.onnx").write_bytes(b"\x00 not a model")
    with pytest.raises(BundleError, match=r"junk\.onnx is not an ONNX model"):
        check_model(tmp_path / "junk.onnx")


def test_describe_reports_opset_ir_and_dynamic_axes() -> None:
    facts = describe(check_model(DEMO_MODELS / "demo_detector_dynamic.onnx"))
    assert (facts.opset, facts.ir_version, facts.precision) == (17, 8, "fp32")
    assert [str(a) for a in facts.dynamic_axes if a.tensor == "images"] == [
        "images[0]=batch",
        "images[2]=height",
        "images[3]=width",
    ]
    assert facts.warnings == ()  # every operator of the demo model: TensorRT 10 and LiteRT take it
    assert describe(check_model(DEMO_MODELS / "demo_detector_int8_qdq.onnx")).precision == "int8"


def _redundant_model(path: Path) -> Path:
    """``(images + (a + b)) -> Identity -> Identity``: onnxslim folds ``a + b`` and drops the Identities."""
    rng = np.random.default_rng(3)
    a, b = (numpy_helper.from_array(rng.random((1, 3, 1, 1), dtype=np.float32), n) for n in ("a", "b"))
    nodes = [
        helper.make_node("Add", ["a", "b"], ["ab"]),
        helper.make_node("Add", ["images", "ab"], ["sum"]),
        helper.make_node("Identity", ["sum"], ["copy"]),
        helper.make_node("Identity", ["copy"], ["output0"]),
    ]
    return _save_model(path, nodes, (a, b), shape=(1, 3, 8, 8))


def test_simplification_is_kept_only_when_lossless(tmp_path: Path) -> None:
    source = _redundant_model(tmp_path / "redundant.onnx")
    tensor = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)
    result = simplify(check_model(source), source, tmp_path / "slim.onnx", tensor)
    assert result.kept and result.path == tmp_path / "slim.onnx", result.note
    assert re.search(r"4 -> [12] nodes, outputs identical", result.note), result.note  # 2 with onnxslim 0.1.48
    with load_runtime("onnxruntime", source) as a, load_runtime("onnxruntime", result.path) as b:
        assert np.array_equal(a.infer([tensor])[0], b.infer([tensor])[0])
    minimal = _save_model(tmp_path / "minimal.onnx", [helper.make_node("Relu", ["images"], ["output0"])])
    already = simplify(check_model(minimal), minimal, tmp_path / "again.onnx", np.zeros((1, 3, 32, 32), np.float32))
    assert not already.kept and already.path == minimal and "already simple (1 node)" in already.note
