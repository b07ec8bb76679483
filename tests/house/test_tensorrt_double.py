"""The TensorRT test double follows TensorRT 10's published signatures."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS, REPO
from testkit.trt_double import TrtDouble

STUBS = REPO / "build" / "typings" / "tensorrt_bindings" / "tensorrt.pyi"


def _stub_classes() -> dict[str, dict[str, list[list[str]]]]:
    """class -> member -> the parameter lists of its overloads ([] for properties and fields)."""
    if not STUBS.is_file():
        pytest.skip(f"{STUBS} is missing: run scripts/tensorrt_stubs.py (scripts/test.sh does)")
    classes: dict[str, dict[str, list[list[str]]]] = {}
    bases: dict[str, list[str]] = {}

    def collect(node: ast.ClassDef, prefix: str = "") -> None:
        members: dict[str, list[list[str]]] = {}
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                params = [a.arg for a in item.args.args if a.arg != "self"]
                members.setdefault(item.name, []).append(params)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                members.setdefault(item.target.id, []).append([])
            elif isinstance(item, ast.ClassDef):
                members.setdefault(item.name, []).append([])
                collect(item, f"{node.name}.")
        classes[prefix + node.name] = members
        bases[prefix + node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]

    for node in ast.parse(STUBS.read_text()).body:
        if isinstance(node, ast.ClassDef):
            collect(node)
    for name in list(classes):  # members of base classes
        for base in bases[name]:
            for member, params in classes.get(base, {}).items():
                classes[name].setdefault(member, params)
    return classes


def test_the_double_follows_the_published_signatures(trt_double: TrtDouble) -> None:
    stubs = _stub_classes()
    checked = 0
    for name in trt_double.trt.__all__:
        value = getattr(trt_double.trt, name)
        if not inspect.isclass(value):
            continue
        assert name in stubs, f"tensorrt.{name} is not in TensorRT 10.13"
        for member, attribute in vars(value).items():
            if member.startswith("_") or member in ("shapes", "entries", "onnx", "calls"):
                continue  # the double's own bookkeeping
            assert member in stubs[name], f"tensorrt.{name}.{member} is not in TensorRT 10.13"
            if inspect.isfunction(attribute):
                params = [p for p in inspect.signature(attribute).parameters if p != "self"]
                assert params in stubs[name][member], f"{name}.{member}{params} vs {stubs[name][member]}"
                checked += 1
    assert checked > 40


@pytest.mark.parametrize(
    ("owner", "removed"),
    [
        ("Builder", "build_engine"),
        ("IBuilderConfig", "max_workspace_size"),
        ("ICudaEngine", "get_binding_index"),
        ("ICudaEngine", "num_bindings"),
        ("IExecutionContext", "execute_async_v2"),
        ("IExecutionContext", "set_binding_shape"),
    ],
)
def test_what_tensorrt_10_removed_is_gone_from_both(trt_double: TrtDouble, owner: str, removed: str) -> None:
    assert removed not in _stub_classes()[owner]
    assert not hasattr(getattr(trt_double.trt, owner), removed)


def test_the_double_refuses_removed_calls_and_a_wrong_order(trt_double: TrtDouble) -> None:
    trt = trt_double.trt
    logger = trt.Logger()
    builder = trt.Builder(logger)
    config = builder.create_builder_config()
    with pytest.raises(AttributeError):
        config.max_workspace_size = 1 << 30
    with pytest.raises(AttributeError):
        builder.build_engine(builder.create_network(0), config)
    with pytest.raises(TypeError, match="must be Dims"):
        builder.create_optimization_profile().set_shape("images", (1, 3, 8, 8), (1, 3, 8, 8), (1, 3, 8, 8))

    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(DEMO_MODELS / "demo_detector_dynamic.onnx"))
    profile = builder.create_optimization_profile()
    shape = trt.Dims([1, 3, 64, 64])
    profile.set_shape("images", shape, shape, trt.Dims([1, 3, 128, 128]))
    config.add_optimization_profile(profile)
    engine = trt.Runtime(logger).deserialize_cuda_engine(builder.build_serialized_network(network, config))
    context = engine.create_execution_context()
    memory = trt_double.memory
    buffers = {name: memory.alloc(1 << 20) for name in ("images", "output0")}
    assert not context.set_tensor_address("images", buffers["images"].address), "address before the input shape"
    assert context.set_input_shape("images", shape)
    assert context.set_tensor_address("images", buffers["images"].address)
    stream = memory.stream()
    assert not context.execute_async_v3(stream.handle), "the output has no address"
    assert context.set_tensor_address("output0", buffers["output0"].address)
    assert context.execute_async_v3(stream.handle)
    assert context.set_input_shape("images", trt.Dims([1, 3, 128, 96]))
    assert not context.execute_async_v3(stream.handle), "shapes changed: addresses are set again first"
    assert not context.set_input_shape("images", trt.Dims([1, 3, 256, 256])), "outside the profile"
    memory.synchronize(stream)
    host = np.empty(8, np.float32)
    memory.to_host(host, buffers["output0"], stream)  # queued: nothing copied until synchronize
    assert memory.log[-1] == "to_host 32"


def test_the_stub_repairs_parse_and_keep_signatures() -> None:
    text = Path(STUBS).read_text() if STUBS.is_file() else pytest.skip("stubs missing")
    ast.parse(text)
    assert "def add_scale_nd(self, input: ITensor, mode: ScaleMode, shift: Weights = None" in text
    assert "channel_axis: int = ...)" in text and "(self, in_: list[PluginTensorDesc]" in text
    init = (STUBS.parent.parent / "tensorrt" / "__init__.pyi").read_text()
    assert "import tensorrt_libs" not in init and "\nbool:" not in init and "__version__: str = '10.13" in init
