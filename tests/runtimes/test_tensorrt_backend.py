"""`runtimes.tensorrt_backend` against the TensorRT test double: execution by name, a worker context,
FP16 outputs, task models' engines decoded as on ONNX Runtime; the probe answers for this machine."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.trt_double import TrtDouble

from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.decoding.rotated import corners
from pipelines.sources.synthetic import SyntheticScene
from runtimes.base import InferenceError
from runtimes.ort_backend import OnnxRuntimeBackend
from runtimes.registry import load_runtime
from runtimes.tensorrt_backend import TensorRTConfig, open_engine
from runtimes.tensorrt_engines import prepare_engine


def test_the_tensorrt_probe_answers_for_the_machine_it_runs_on() -> None:
    """Whether TensorRT is installed decides the answer; a Jetson must pass this test too."""
    from runtimes.registry import available_runtimes

    info = available_runtimes(["tensorrt"])["tensorrt"]
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert not info.available and "not installed" in (info.reason or "")
    else:
        assert info.version is not None


FIXED = DEMO_MODELS / "demo_detector.onnx"  # dynamic batch only, 320x320


def config(tmp_path: Path, **changes: object) -> TensorRTConfig:
    return TensorRTConfig(engine_cache_dir=tmp_path / "engines", **changes)


def frame(shape: tuple[int, ...] = (1, 3, 320, 320), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


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


def test_an_engine_with_host_code_is_never_deserialized(
    trt_double: TrtDouble, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend turns TensorRT's host-code setting off itself, so a plan carrying executable
    host code is refused even where the runtime's default would allow it (the double's default
    is made permissive here; TensorRT 10's is off)."""
    from runtimes.tensorrt_backend import EngineLoadError, TensorRTBackend

    prepared = prepare_engine(FIXED, config(tmp_path))
    image = trt_double.internals.EngineImage.parse(prepared.path.read_bytes())
    image.host_code = True
    planted = tmp_path / "host-code.engine"
    planted.write_bytes(image.serialize())
    initial = trt_double.trt.Runtime.__init__

    def permissive(self, logger) -> None:  # type: ignore[no-untyped-def]
        initial(self, logger)
        self.engine_host_code_allowed = True

    monkeypatch.setattr(trt_double.trt.Runtime, "__init__", permissive)
    with pytest.raises(EngineLoadError, match="contains host code"):
        TensorRTBackend(planted, FIXED, prepared.record)
    runtime = TensorRTBackend(prepared.path, FIXED, prepared.record)  # the same engine without host code loads
    assert runtime._trt_runtime.engine_host_code_allowed is False
    runtime.close()


def _by_place(found: Detections) -> Detections:
    """`found` by class, then left edge: FP16 may swap two detections of nearly equal scores."""
    return found[np.lexsort((found.xyxy[:, 0].round(), found.class_id))]


@pytest.mark.parametrize(
    "name", ["demo_segment.onnx", "demo_segment_e2e.onnx", "demo_pose.onnx", "demo_pose_e2e.onnx", "demo_obb.onnx"]
)
def test_a_task_model_s_engine_decodes_as_onnxruntime_s_outputs_do(
    trt_double: TrtDouble, tmp_path: Path, name: str
) -> None:
    """Segmentation's two outputs (boxes with mask coefficients, and the prototypes), pose's
    keypoints, OBB's angle: through an engine (FP16 on the double), with the metadata the engine
    record keeps, the Detector picks the same decoder and finds what ONNX Runtime's outputs give."""
    model = DEMO_MODELS / name
    settings = config(tmp_path)
    prepare_engine(model, settings)
    image, _ = SyntheticScene(640, 480, num_shapes=5, seed=310_001).render(3)
    with load_runtime("tensorrt", model, settings) as engine, OnnxRuntimeBackend(model) as reference:
        assert [o.shape for o in engine.outputs] == [o.shape for o in reference.outputs]
        on_engine, on_reference = Detector(engine), Detector(reference)
        assert on_engine.decoder == on_reference.decoder != "yolov8"
        got, want = _by_place(on_engine.detect(image)), _by_place(on_reference.detect(image))
    assert len(want) >= 1, "the demo model finds the scene's shapes (the pose model only the triangles)"
    assert got.class_id.tolist() == want.class_id.tolist()
    np.testing.assert_allclose(got.xyxy, want.xyxy, atol=1.0)
    if want.masks is not None:
        assert got.masks is not None
        a, b = got.masks.bitmaps(), want.masks.bitmaps()
        iou = (a & b).sum(axis=(1, 2)) / np.maximum((a | b).sum(axis=(1, 2)), 1)
        assert iou.min() >= 0.9
    if want.keypoints is not None:
        assert got.keypoints is not None
        np.testing.assert_allclose(got.keypoints[..., :2], want.keypoints[..., :2], atol=1.0)
    if want.xywhr is not None:
        assert got.xywhr is not None
        np.testing.assert_allclose(corners(got.xywhr), corners(want.xywhr), atol=1.0)
    assert any(part is not None for part in (want.masks, want.keypoints, want.xywhr)), "a task model, not boxes only"
