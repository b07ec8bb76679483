"""`pipelines.shared_model`: frames gathered and batched across cameras, bounded waits, one session or an
interpreter per serving thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from testkit import DEMO_MODELS

from pipelines.decoding.detector import Detector
from pipelines.shared_model import BatchPolicy, Request, SharedModel, batch_axis, gather
from pipelines.sources.synthetic import SyntheticScene
from runtimes.base import InferenceError
from runtimes.registry import load_runtime


def demo(name: str = "demo_detector.onnx") -> Detector:
    runtime = "onnxruntime" if name.endswith(".onnx") else "litert"
    return Detector(load_runtime(runtime, DEMO_MODELS / name))


def tensors(detector: Detector, count: int) -> list[np.ndarray]:
    """`count` different frames of the synthetic scene, prepared for `detector`."""
    return [detector.prepare(SyntheticScene(seed=seed).render(0)[0])[0] for seed in range(count)]


def request(camera: str, shape: tuple[int, ...] = (1, 3, 8, 8), dtype: type = np.float32) -> Request:
    return Request(camera, np.zeros(shape, dtype))


@pytest.mark.parametrize(
    ("pending", "max_batch", "joined", "left"),
    [
        (["b", "c", "d"], 8, ["a", "b", "c", "d"], []),
        (["b", "a", "c"], 8, ["a", "b", "c"], ["a"]),  # never two frames of one camera
        (["b", "c", "d"], 3, ["a", "b", "c"], ["d"]),  # at most max_batch
        (["b", "c*", "d"], 8, ["a", "b", "d"], ["c*"]),  # c* has another shape (a dynamic-size model)
        (["b~", "c"], 8, ["a", "c"], ["b~"]),  # b~ is uint8 pixels: normalised, a batch at once, or not at all
        ([], 8, ["a"], []),
    ],
)
def test_gather_one_frame_per_camera(pending: list[str], max_batch: int, joined: list[str], left: list[str]) -> None:
    def waiting_request(name: str) -> Request:
        shape = (1, 3, 8, 16) if name.endswith("*") else (1, 3, 8, 8)
        return request(name.rstrip("*~"), shape, np.uint8 if name.endswith("~") else np.float32)

    waiting = [waiting_request(c) for c in pending]
    names = {id(r): p for r, p in zip(waiting, pending, strict=True)}
    batch = [request("a")]
    gather(batch, waiting, max_batch)
    assert [names.get(id(r), r.camera) for r in batch] == joined
    assert [names[id(r)] for r in waiting] == left


def test_batch_axis_of_the_demo_models() -> None:
    assert batch_axis(demo().runtime) is None
    assert batch_axis(demo("demo_detector_int8.tflite").runtime) == "its input has a fixed batch size"


def test_cameras_batched_together_get_their_own_outputs() -> None:
    """Four cameras submit at once: one batch (or few), and each camera's outputs equal what the
    model gives its frame alone."""
    reference = demo()
    alone = [reference.infer(t) for t in tensors(reference, 4)]
    shared = SharedModel(demo(), policy=BatchPolicy(max_wait_s=2.0))
    holds = [shared.attach(f"cam{i}") for i in range(4)]
    # what a camera's frame holds while it waits: uint8 pixels, normalised by the serving thread
    frames = [hold.prepare(SyntheticScene(seed=i).render(0)[0])[0] for i, hold in enumerate(holds)]
    assert {t.dtype for t in frames} == {np.dtype(np.uint8)}
    results: dict[int, list[np.ndarray]] = {}
    start = threading.Barrier(4)

    def camera(i: int) -> None:
        start.wait()
        results[i] = holds[i].infer(frames[i])

    threads = [threading.Thread(target=camera, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stats = shared.stats()
    for hold in holds:
        hold.close()
    assert stats.batching and stats.frames == 4 and stats.mean_batch > 1, stats
    for i in range(4):
        assert results[i][0].shape == alone[i][0].shape
        np.testing.assert_allclose(results[i][0], alone[i][0], rtol=1e-4, atol=1e-4)
    assert shared.closed and reference.runtime._session is not None
    reference.close()


def test_the_wait_for_other_cameras_is_bounded() -> None:
    """Three cameras attached, one submits: its frame still runs (alone) after the wait."""
    detector = demo()
    shared = SharedModel(detector, policy=BatchPolicy(max_wait_s=0.05))
    holds = [shared.attach(name) for name in ("a", "b", "c")]
    outputs = holds[0].infer(tensors(detector, 1)[0])
    assert outputs[0].shape[0] == 1
    assert (shared.stats().batches, shared.stats().frames) == (1, 1)
    for hold in holds:
        hold.close()


def test_the_last_camera_to_let_go_closes_the_model() -> None:
    detector = demo()
    shared = SharedModel(detector)
    a, b = shared.attach("a"), shared.attach("b")
    a.close()
    a.close()  # a second close of one hold does not count twice
    assert not shared.closed and shared.stats().cameras == 1
    b.close()
    assert shared.closed and detector.runtime._session is None
    with pytest.raises(InferenceError, match="was closed"):
        b.infer(tensors(demo(), 1)[0])
    with pytest.raises(InferenceError, match="was closed"):
        shared.attach("c")


def test_litert_gets_one_interpreter_per_serving_thread() -> None:
    """LiteRT interpreters are not thread-safe: two serving threads, two interpreters on the one
    model file, the same answers."""
    detector = demo("demo_detector_int8.tflite")
    shared = SharedModel(detector, workers=2)
    first, second = shared._runtimes
    assert first is detector.runtime and second is not first
    assert second._interpreter is not first._interpreter and second.model_path == first.model_path
    frames = tensors(detector, 2)
    holds = [shared.attach("a"), shared.attach("b")]
    results: dict[int, list[np.ndarray]] = {}
    threads = [threading.Thread(target=lambda i=i: results.update({i: holds[i].infer(frames[i])})) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not shared.batching
    for i in range(2):
        np.testing.assert_allclose(results[i][0], detector.infer(frames[i])[0], atol=1e-6)
    for hold in holds:
        hold.close()
    assert first._interpreter is None and second._interpreter is None


def test_onnx_runtime_serves_every_thread_with_one_session() -> None:
    runtime = demo().runtime
    assert runtime.for_worker() is runtime
    runtime.close()


def test_two_cameras_batched_on_one_model_keep_detections_by_their_own_thresholds() -> None:
    """One inference for both cameras' frames (one batch), then each camera's own conf and
    classes: the camera with conf 0.95 keeps only what scores above it, the one with the model's
    0.25 keeps more of the same frames, a third keeps only squares (class 1)."""
    from pipelines.decoding.detection_filter import DetectionFilter

    reference = demo()
    scene = SyntheticScene(seed=1)
    images = [scene.render(index)[0] for index in (20, 30, 40)]  # frames with scores between 0.25 and 0.95
    shared = SharedModel(demo(), policy=BatchPolicy(max_wait_s=5.0))
    holds = {
        "low": shared.attach("low"),
        "high": shared.attach("high", DetectionFilter(conf=0.95)),
        "squares": shared.attach("squares", DetectionFilter(classes=frozenset({1}))),
    }
    found: dict[str, list] = {name: [] for name in holds}

    def camera(name: str, start: threading.Barrier) -> None:
        hold = holds[name]
        for image in images:
            start.wait()
            tensor, transform = hold.prepare(image)
            found[name].append(hold.postprocess(hold.infer(tensor), transform))

    start = threading.Barrier(len(holds))
    threads = [threading.Thread(target=camera, args=(name, start)) for name in holds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    stats = shared.stats()
    for hold in holds.values():
        hold.close()
    assert stats.frames == 9 and stats.mean_batch > 1, f"the cameras' frames were inferred together: {stats}"
    for i, image in enumerate(images):
        alone = reference.detect(image)  # the model's own thresholds: conf 0.25, every class
        low, high, squares = found["low"][i], found["high"][i], found["squares"][i]
        assert low.confidence.tolist() == pytest.approx(alone.confidence.tolist(), abs=1e-4)
        assert high.confidence.tolist() == pytest.approx([s for s in alone.confidence if s > 0.95], abs=1e-4)
        assert squares.class_id.tolist() == [c for c in alone.class_id if c == 1]
    assert any(len(found["high"][i]) < len(found["low"][i]) for i in range(3)), "the thresholds made a difference"
    assert any(set(found["low"][i].class_id) - {1} for i in range(3)), "there were other classes to drop"
    reference.close()


def test_two_cameras_on_one_shared_segmentation_model_get_their_own_masks() -> None:
    """Two cameras submit at once to the demo segmentation model (batch 1: their frames are
    served one after the other, never mixed): each gets both outputs, the boxes' and the
    prototypes, equal to what the model gives its frame alone."""
    reference = demo("demo_segment.onnx")
    frames = tensors(reference, 2)
    alone = [reference.infer(t) for t in frames]
    shared = SharedModel(demo("demo_segment.onnx"), policy=BatchPolicy(max_wait_s=0.5))
    holds = [shared.attach(f"cam{i}") for i in range(2)]
    results: dict[int, list[np.ndarray]] = {}
    start = threading.Barrier(2)

    def camera(i: int) -> None:
        start.wait()
        results[i] = holds[i].infer(frames[i])

    threads = [threading.Thread(target=camera, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert shared.stats().frames == 2
    for hold in holds:
        hold.close()
    for i in range(2):
        assert len(results[i]) == 2, "the boxes' output and the prototypes"
        for got, expected in zip(results[i], alone[i], strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert not np.allclose(results[0][1], results[1][1]), "two frames, two sets of prototypes"
    reference.close()
