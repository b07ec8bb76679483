"""`runtimes.tensorrt_build` against the TensorRT test double: parser errors by node, builder config,
FP16 and INT8, profiles, cancelling."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.trt_double import TrtDouble

from runtimes.base import InferenceError
from runtimes.ort_backend import OnnxRuntimeBackend
from runtimes.tensorrt_backend import TensorRTConfig, engine_precision, open_engine
from runtimes.tensorrt_build import BuildCancelled, BuildOptions, EngineBuildError, Profile, build_engine
from runtimes.tensorrt_engines import prepare_engine

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
