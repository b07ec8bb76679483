"""The TensorRT backend against the TensorRT test double (tests/fakes/tensorrt_double): engine
builds (parser errors, precision, INT8 from Q/DQ or calibration, profiles, timing cache,
progress, cancel), execution by tensor name through device memory, and the engine cache."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from runtimes.base import InferenceError
from runtimes.engine_cache import EngineCache, EngineKey
from runtimes.ort_backend import OnnxRuntimeBackend
from runtimes.registry import load_runtime
from runtimes.tensorrt_backend import EngineNotReady, TensorRTConfig, engine_precision, open_engine
from runtimes.tensorrt_build import BuildCancelled, BuildOptions, EngineBuildError, Profile, build_engine
from runtimes.tensorrt_engines import Prebuilt, prepare_engine
from tests.conftest import DEMO_MODELS
from tests.trt_double import TrtDouble, trt_double

__all__ = ["trt_double"]

FIXED = DEMO_MODELS / "demo_detector.onnx"  # dynamic batch only, 320x320
DYNAMIC = DEMO_MODELS / "demo_detector_dynamic.onnx"  # dynamic batch, height and width
QDQ = DEMO_MODELS / "demo_detector_int8_qdq.onnx"
PROFILE = {"min": [1, 3, 160, 160], "opt": [1, 3, 320, 320], "max": [1, 3, 640, 640]}


def config(tmp_path: Path, **changes: object) -> TensorRTConfig:
    return TensorRTConfig(engine_cache_dir=tmp_path / "engines", **changes)


def frame(shape: tuple[int, ...] = (1, 3, 320, 320), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


def test_parser_errors_name_each_node(trt_double: TrtDouble, constant_model) -> None:
    trt_double.internals.UNSUPPORTED_OPS.update({"ReduceSum", "Mul"})
    path = constant_model(np.zeros((1, 2, 3), np.float32))
    with pytest.raises(EngineBuildError) as caught:
        build_engine(path, BuildOptions())
    assert caught.value.problems == [
        "node 0 (ReduceSum ''): No importer registered for op: ReduceSum.",
        "node 1 (Mul ''): No importer registered for op: Mul.",
    ]
    assert "TensorRT cannot parse model.onnx" in str(caught.value)


@pytest.mark.models
def test_dynamically_quantized_yolov8n_is_refused_node_by_node(trt_double: TrtDouble, shared_models: Path) -> None:
    """ConvInteger / DynamicQuantizeLinear (ONNX Runtime's dynamic quantization) have no TensorRT
    importer: every such node is reported, by name."""
    with pytest.raises(EngineBuildError) as caught:
        build_engine(shared_models / "yolov8n_int8_640.onnx", BuildOptions())
    problems = caught.value.problems
    assert len(problems) == 64 + 59  # the model's ConvInteger and DynamicQuantizeLinear nodes
    assert any("ConvInteger '/model.0/conv/Conv_quant'" in p for p in problems), problems[:3]


def test_builder_config_workspace_fp16_timing_cache_and_progress(trt_double: TrtDouble, tmp_path: Path) -> None:
    progress = []
    timing = tmp_path / "timing.cache"
    built = build_engine(
        FIXED, BuildOptions("fp16", workspace_mb=256, timing_cache=timing), on_progress=progress.append
    )
    (build,) = trt_double.internals.builds
    assert build["flags"] == ["FP16"] and build["workspace"] == 256 << 20 and build["timing_cache"]
    assert build["profile"] == {"images": [[1, 3, 320, 320]] * 3}, "batch-only dynamic: batch 1"
    assert built.precision == "fp16" and built.int8_source is None
    assert progress[0].fraction == 0.0 and progress[-1].fraction == 1.0
    assert progress[-1].phase == "Building engine"
    assert timing.read_bytes() != b"" and "fp16" in timing.read_text()
    build_engine(FIXED, BuildOptions("fp16", timing_cache=timing))
    assert timing.read_text().count("fp16") == 1, "the second build reused the timing cache's entry"


def test_fp16_falls_back_to_fp32_without_fast_fp16(trt_double: TrtDouble) -> None:
    trt_double.internals.GPU.fast_fp16 = False
    built = build_engine(FIXED, BuildOptions("fp16"))
    assert built.precision == "fp32" and trt_double.internals.builds[0]["flags"] == []
    assert built.notes == ("this GPU has no fast FP16: built in FP32",)


def test_int8_from_qdq_and_from_calibration(trt_double: TrtDouble, tmp_path: Path) -> None:
    assert engine_precision(QDQ, "fp16") == "int8" and engine_precision(FIXED, "fp16") == "fp16"
    built = build_engine(QDQ, BuildOptions("int8"))
    assert (built.precision, built.int8_source) == ("int8", "qdq")
    assert trt_double.internals.builds[-1]["flags"] == ["FP16", "INT8"]

    with pytest.raises(EngineBuildError, match=r"int8 needs an explicitly quantized \(Q/DQ\) model or"):
        build_engine(FIXED, BuildOptions("int8"))

    fed = []

    def batches():
        for i in range(3):
            fed.append(i)
            yield frame(seed=i)

    cache = tmp_path / "calibration.cache"
    options = BuildOptions("int8", calibration=batches, calibration_cache=cache)
    built = build_engine(FIXED, options, memory=trt_double.memory)
    assert (built.precision, built.int8_source) == ("int8", "calibration")
    assert trt_double.internals.builds[-1]["calibrated"] and fed == [0, 0, 1, 2]  # one peek, then three batches
    assert cache.read_bytes() == b"calibrated on 3 batches"
    assert trt_double.memory.live == {"buffers": 0, "pinned": 0, "streams": 0}, "the calibrator freed its memory"
    fed.clear()
    build_engine(FIXED, options, memory=trt_double.memory)
    assert fed == [0], "with a calibration cache, no image is fed again"


def test_dynamic_shapes_need_a_profile_and_stay_inside_it(trt_double: TrtDouble, tmp_path: Path) -> None:
    with pytest.raises(EngineBuildError, match=r"dynamic input\(s\) images\(-1, 3, -1, -1\) need an optimization"):
        build_engine(DYNAMIC, BuildOptions())
    with pytest.raises(EngineBuildError, match="does not fit input images"):
        build_engine(DYNAMIC, BuildOptions(profile=Profile((1, 160, 160), (1, 320, 320), (1, 640, 640))))
    settings = config(tmp_path, profile=PROFILE)
    prepare_engine(DYNAMIC, settings)
    with open_engine(DYNAMIC, settings) as runtime, OnnxRuntimeBackend(DYNAMIC) as reference:
        assert runtime.inputs[0].shape == (None, 3, None, None)
        for shape in [(1, 3, 320, 320), (1, 3, 192, 256)]:
            (got,), (want,) = runtime.infer([frame(shape)]), reference.infer([frame(shape)])
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=0.02, rtol=0.01)
        with pytest.raises(InferenceError, match=r"shape \(1, 3, 96, 96\) is outside the engine's profile"):
            runtime.infer([frame((1, 3, 96, 96))])


def test_cancel_stops_a_build(trt_double: TrtDouble) -> None:
    cancel = threading.Event()

    def stop_at_half(progress) -> None:
        if progress.fraction >= 0.5:
            cancel.set()

    with pytest.raises(BuildCancelled, match="cancelled"):
        build_engine(FIXED, BuildOptions(), on_progress=stop_at_half, cancel=cancel)


def test_execution_by_name_matches_onnxruntime_and_frees_memory(trt_double: TrtDouble, tmp_path: Path) -> None:
    settings = config(tmp_path)
    prepare_engine(FIXED, settings)
    runtime = load_runtime("tensorrt", FIXED, settings)
    context = runtime._context
    with OnnxRuntimeBackend(FIXED) as reference:
        for seed in range(3):
            (got,), (want,) = runtime.infer([frame(seed=seed)]), reference.infer([frame(seed=seed)])
            assert got.dtype == np.float32
            np.testing.assert_allclose(got, want, atol=0.02, rtol=0.01)  # FP16-sized differences
            assert np.abs(got - want).max() > 0, "the FP16 engine is not bit-identical to FP32"
    one_call = context.calls[-3:]
    assert one_call == ["set_tensor_address images", "set_tensor_address output0", "execute_async_v3"]
    assert runtime.device == "Orin (test double) (fp16)" and not runtime.concurrent
    runtime.close()
    runtime.close()
    assert trt_double.memory.live == {"buffers": 0, "pinned": 0, "streams": 0}
    with pytest.raises(InferenceError, match="was closed"):
        runtime.infer([frame()])


def test_a_worker_is_another_context_on_the_same_engine(trt_double: TrtDouble, tmp_path: Path) -> None:
    """`for_worker`: its own execution context, stream and buffers on the one engine; two
    threads infer at once and get the same answers; closing the worker leaves the engine serving."""
    settings = config(tmp_path)
    prepare_engine(FIXED, settings)
    runtime = load_runtime("tensorrt", FIXED, settings)
    streams = trt_double.memory.live["streams"]
    worker = runtime.for_worker()
    assert worker._engine is runtime._engine and worker._context is not runtime._context
    assert trt_double.memory.live["streams"] == streams + 1
    (want,) = runtime.infer([frame(seed=1)])
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda r: r.infer([frame(seed=1)])[0], [runtime, worker] * 4))
    for got in answers:
        np.testing.assert_array_equal(got, want)
    worker.close()
    assert trt_double.memory.live["streams"] == streams
    np.testing.assert_array_equal(runtime.infer([frame(seed=1)])[0], want)
    with pytest.raises(InferenceError, match="was closed"):
        worker.infer([frame()])
    runtime.close()
    assert trt_double.memory.live == {"buffers": 0, "pinned": 0, "streams": 0}
    with pytest.raises(InferenceError, match="was closed"):
        runtime.for_worker()


def _fp16_output_model(tmp_path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["images"], ["mean"], axes=[2, 3], keepdims=0),
            helper.make_node("Cast", ["mean"], ["output0"], to=TensorProto.FLOAT16),
        ],
        "half",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT16, [1, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "half.onnx"
    onnx.save(model, str(path))
    return path


def test_fp16_outputs_are_converted_to_float32(trt_double: TrtDouble, tmp_path: Path) -> None:
    path = _fp16_output_model(tmp_path)
    settings = config(tmp_path, precision="fp32")
    prepare_engine(path, settings)
    with open_engine(path, settings) as runtime:
        assert runtime.outputs[0].dtype == np.float32
        x = np.stack([np.full((8, 8), v, np.float32) for v in (0.25, 0.5, 1.5)])[None]
        (out,) = runtime.infer([x])
    assert out.dtype == np.float32 and out.tolist() == [[0.25, 0.5, 1.5]]


def test_cache_key_fields_and_lookup(trt_double: TrtDouble, tmp_path: Path) -> None:
    settings = config(tmp_path)
    with pytest.raises(EngineNotReady, match="it has not been built yet") as caught:
        open_engine(FIXED, settings)
    key = caught.value.key
    assert key.gpu_name == "Orin (test double)" and key.compute_capability == (8, 7)
    assert key.tensorrt_version == "10.13.0.35" and key.precision == "fp16" and key.profile is None
    digests = {key.digest}
    for change in [
        {"onnx_sha256": "0" * 64},
        {"tensorrt_version": "10.3.0"},
        {"gpu_name": "Xavier"},
        {"compute_capability": (7, 2)},
        {"precision": "fp32"},
        {"profile": ((1, 3, 320, 320),) * 3},
    ]:
        digests.add(EngineKey(**{**key.to_json(), "compute_capability": key.compute_capability, **change}).digest)
    assert len(digests) == 7, "every field of the key changes the file name"
    prepared = prepare_engine(FIXED, settings)
    assert prepared.how == "built" and prepared.key == key and prepared.path.name == f"{key.digest}.engine"
    assert prepare_engine(FIXED, settings).how == "cache"
    assert EngineKey.from_json(key.to_json()) == key


def test_a_corrupt_cache_entry_is_discarded_and_rebuilt(trt_double: TrtDouble, tmp_path: Path) -> None:
    settings = config(tmp_path)
    prepared = prepare_engine(FIXED, settings)
    prepared.path.write_bytes(prepared.path.read_bytes()[:100])  # a torn write, a bad sector
    with pytest.raises(EngineNotReady, match=r"cannot deserialize .* discarded and will be built again"):
        open_engine(FIXED, settings)
    assert not prepared.path.exists()
    assert prepare_engine(FIXED, settings).how == "built"
    with open_engine(FIXED, settings) as runtime:
        assert runtime.infer([frame()])[0].shape == (1, 7, 2100)


def test_a_new_tensorrt_version_gets_its_own_engine(trt_double: TrtDouble, tmp_path: Path) -> None:
    settings = config(tmp_path)
    old = prepare_engine(FIXED, settings)
    trt_double.internals.VERSION = trt_double.trt.__version__ = "10.14.1.48"  # JetPack upgraded TensorRT
    try:
        with pytest.raises(EngineNotReady, match=r"TensorRT 10\.14\.1\.48.*it has not been built yet"):
            open_engine(FIXED, settings)
        new = prepare_engine(FIXED, settings)
        assert new.how == "built" and new.path != old.path and old.path.exists(), "the old one stays for a downgrade"
        # an engine of the old version under the new key (a copied cache) fails to deserialize: rebuilt
        new.path.write_bytes(old.path.read_bytes())
        with pytest.raises(EngineNotReady, match="not compatible with this version of TensorRT"):
            open_engine(FIXED, settings)
        assert prepare_engine(FIXED, settings).how == "built"
    finally:
        trt_double.internals.VERSION = trt_double.trt.__version__ = "10.13.0.35"


def test_prebuilt_engines_are_used_only_on_an_exact_match(trt_double: TrtDouble, tmp_path: Path) -> None:
    elsewhere = config(tmp_path / "operator")
    shipped = prepare_engine(FIXED, elsewhere)
    other_gpu = EngineKey(**{**shipped.key.to_json(), "gpu_name": "Xavier", "compute_capability": (7, 2)})
    settings = config(tmp_path / "device")
    wrong = prepare_engine(FIXED, settings, prebuilt=[Prebuilt(other_gpu, shipped.path)])
    assert wrong.how == "built"
    settings = config(tmp_path / "device2")
    right = prepare_engine(
        FIXED, settings, prebuilt=[Prebuilt(other_gpu, shipped.path), Prebuilt(shipped.key, shipped.path)]
    )
    assert right.how == "prebuilt" and right.record.origin == "prebuilt"
    assert right.path.read_bytes() == shipped.path.read_bytes()


def test_a_failed_build_is_recorded_and_not_retried_unless_forced(trt_double: TrtDouble, tmp_path: Path) -> None:
    settings = config(tmp_path)
    trt_double.internals.UNSUPPORTED_OPS.add("Conv")
    with pytest.raises(EngineBuildError):
        prepare_engine(FIXED, settings)
    with pytest.raises(EngineNotReady, match="its last build failed: TensorRT cannot parse") as caught:
        open_engine(FIXED, settings)
    assert caught.value.failure is not None
    trt_double.internals.UNSUPPORTED_OPS.discard("Conv")
    builds = len(trt_double.internals.builds)
    with pytest.raises(EngineBuildError, match=r"the last build of this engine failed .*--force builds it again"):
        prepare_engine(FIXED, settings)
    assert len(trt_double.internals.builds) == builds
    assert prepare_engine(FIXED, settings, force=True).how == "built"
    assert EngineCache(settings.engine_cache_dir).failure(caught.value.key) is None
