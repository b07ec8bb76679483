"""The ONNX Runtime and LiteRT backends on real models, and the registry's guarded imports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runtimes.base import InferenceError, ModelLoadError, RuntimeUnavailable
from runtimes.litert_backend import LiteRTBackend, LiteRTConfig
from runtimes.ort_backend import OnnxRuntimeBackend, OnnxRuntimeConfig, provider_list
from runtimes.registry import BACKENDS, available_runtimes, load_runtime


def test_ort_specs_metadata_and_infer(constant_model) -> None:
    out = np.arange(2 * 6, dtype=np.float32).reshape(1, 2, 6)
    path = constant_model(out, metadata={"names": "{0: 'a', 1: 'b'}", "imgsz": "[64, 64]", "stride": "32"})
    with OnnxRuntimeBackend(path, OnnxRuntimeConfig(intra_op_threads=1, graph_optimization="basic")) as rt:
        (spec,) = rt.inputs
        assert (spec.name, spec.shape, spec.dtype, spec.layout) == ("images", (1, 3, 64, 64), np.float32, "NCHW")
        assert rt.outputs[0].shape == (1, 2, 6)
        assert rt.metadata.names == {0: "a", 1: "b"} and rt.metadata.imgsz == (64, 64)
        assert rt.device == "CPUExecutionProvider"
        (result,) = rt.infer([np.ones((1, 3, 64, 64), np.float32)])
        np.testing.assert_array_equal(result, out)


def test_ort_session_options_follow_the_config(constant_model) -> None:
    path = constant_model(np.zeros((1, 2, 6), np.float32))
    with OnnxRuntimeBackend(path) as rt:
        options = rt._session.get_session_options()
        assert not options.enable_mem_pattern and options.intra_op_num_threads == 0
        assert rt.concurrent
    with OnnxRuntimeBackend(path, OnnxRuntimeConfig(memory_pattern=True, intra_op_threads=1)) as rt:
        options = rt._session.get_session_options()
        assert options.enable_mem_pattern and options.intra_op_num_threads == 1


def test_ort_dynamic_axes_are_none(constant_model) -> None:
    path = constant_model(np.zeros((1, 5, 10), np.float32), input_shape=("batch", 3, "height", "width"))
    with OnnxRuntimeBackend(path) as rt:
        assert rt.inputs[0].shape == (None, 3, None, None)
        assert rt.inputs[0].layout == "NCHW"
        assert rt.infer([np.zeros((1, 3, 32, 48), np.float32)])[0].shape == (1, 5, 10)


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros((1, 3, 32, 32), np.float32), r"expected shape \(1, 3, 64, 64\), got \(1, 3, 32, 32\)"),
        (np.zeros((1, 3, 64, 64), np.float64), "expected dtype float32, got float64"),
    ],
)
def test_ort_rejects_wrong_inputs(constant_model, array, message) -> None:
    with (
        OnnxRuntimeBackend(constant_model(np.zeros((1, 5, 10), np.float32))) as rt,
        pytest.raises(InferenceError, match=message),
    ):
        rt.infer([array])


def test_ort_not_a_model_and_missing_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf" * 10)
    with pytest.raises(ModelLoadError, match=r"ONNX Runtime cannot load .*junk\.onnx"):
        OnnxRuntimeBackend(junk)
    with pytest.raises(ModelLoadError, match="model file not found"):
        OnnxRuntimeBackend(tmp_path / "missing.onnx")


def test_provider_list_keeps_preference_order_and_ends_on_cpu(tmp_path: Path) -> None:
    config = OnnxRuntimeConfig(providers=["cuda", "tensorrt"], trt_engine_cache_dir=tmp_path, trt_fp16=False)
    installed = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    assert provider_list(config, installed) == [
        ("CUDAExecutionProvider", {}),
        (
            "TensorrtExecutionProvider",
            {"trt_fp16_enable": False, "trt_engine_cache_enable": True, "trt_engine_cache_path": str(tmp_path)},
        ),
        ("CPUExecutionProvider", {}),
    ]
    assert provider_list(OnnxRuntimeConfig(), ["CPUExecutionProvider"]) == [("CPUExecutionProvider", {})]


def test_config_rejects_unknown_keys_and_backends() -> None:
    from pydantic import TypeAdapter, ValidationError

    from runtimes.registry import RuntimeConfig

    adapter = TypeAdapter(RuntimeConfig)
    assert isinstance(adapter.validate_python({"type": "litert", "num_threads": 2}), LiteRTConfig)
    with pytest.raises(ValidationError, match="providers"):
        adapter.validate_python({"type": "onnxruntime", "providers": ["rocm"]})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        adapter.validate_python({"type": "litert", "threads": 2})
    with pytest.raises(ValidationError, match="does not match any of the expected tags"):
        adapter.validate_python({"type": "openvino"})


def test_litert_int8_model_specs_and_infer(shared_models: Path) -> None:
    with LiteRTBackend(shared_models / "yolov8n_int8io_640.tflite", LiteRTConfig(num_threads=2)) as rt:
        (spec,) = rt.inputs
        assert (spec.shape, spec.dtype, spec.layout) == ((1, 640, 640, 3), np.int8, "NHWC")
        assert spec.quantization is not None and spec.quantization.zero_point == -128
        assert spec.quantization.scale == pytest.approx(1 / 255)
        assert rt.outputs[0].is_quantized
        assert rt.metadata.names is not None and rt.metadata.names[0] == "person"
        (out,) = rt.infer([np.full((1, 640, 640, 3), -14, np.int8)])
        assert out.shape == (1, 84, 8400) and out.dtype == np.int8


def test_litert_uint8_ssd_has_four_outputs(shared_models: Path) -> None:
    with LiteRTBackend(shared_models / "ssd_mobilenet_v1_coco_quant_300.tflite") as rt:
        assert rt.inputs[0].dtype == np.uint8
        assert [o.shape for o in rt.outputs] == [(1, 10, 4), (1, 10), (1, 10), (1,)]
        assert rt.metadata.names is None


def test_litert_bad_delegate_and_bad_model(tmp_path: Path) -> None:
    model = tmp_path / "junk.tflite"
    model.write_bytes(b"\0" * 64)
    with pytest.raises(RuntimeUnavailable, match=r"cannot load LiteRT delegate .*libnope\.so"):
        LiteRTBackend(model, LiteRTConfig(delegate=tmp_path / "libnope.so"))
    with pytest.raises(ModelLoadError, match=r"LiteRT cannot load .*junk\.tflite"):
        LiteRTBackend(model)


def test_registry_reports_what_is_installed() -> None:
    infos = available_runtimes()
    assert infos["onnxruntime"].available and "CPUExecutionProvider" in infos["onnxruntime"].devices
    assert infos["litert"].available and infos["litert"].version
    tensorrt = infos["tensorrt"]
    assert tensorrt.available or tensorrt.reason, "an unavailable runtime says why (on a Jetson it is available)"


def test_registry_missing_library_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the probe process runs (`BACKENDS[name].availability`), here in this process with
    the imports refused."""
    import builtins

    real_import = builtins.__import__

    def no_litert(name, *args, **kwargs):
        if name.startswith(("ai_edge_litert", "tflite_runtime")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_litert)
    info = BACKENDS["litert"].availability()
    assert not info.available and "neither ai-edge-litert nor tflite-runtime" in (info.reason or "")
    with pytest.raises(RuntimeUnavailable, match="neither ai-edge-litert"):
        load_runtime("litert", Path("x.tflite"))
    with pytest.raises(RuntimeUnavailable, match=r"no native TensorRT backend|not installed"):
        load_runtime("tensorrt", Path("x.onnx"))
