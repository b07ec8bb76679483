"""One model shared by several cameras: batching, routing of results, per-thread runtimes, and
the daemon's cameras holding one runtime through hot swaps and rollbacks."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from agent.config.models import CamerasSection, PipelineSection
from agent.hardware.probe import probe
from agent.serving.cameras import Cameras
from pipelines.detector import Detector
from pipelines.shared_model import BatchPolicy, CameraModel, Request, SharedModel, batch_axis, gather
from pipelines.synthetic import SyntheticScene
from runtimes.base import InferenceError
from runtimes.registry import load_runtime
from tests.conftest import DEMO_MODELS
from tests.mqtt_tools import wait_until
from tests.test_cameras import install_versions


def demo(name: str = "demo_detector.onnx") -> Detector:
    runtime = "onnxruntime" if name.endswith(".onnx") else "litert"
    return Detector(load_runtime(runtime, DEMO_MODELS / name))


def tensors(detector: Detector, count: int) -> list[np.ndarray]:
    """`count` different frames of the synthetic scene, prepared for `detector`."""
    return [detector.prepare(SyntheticScene(seed=seed).render(0)[0])[0] for seed in range(count)]


def request(camera: str, shape: tuple[int, ...] = (1, 3, 8, 8)) -> Request:
    return Request(camera, np.zeros(shape, np.float32))


@pytest.mark.parametrize(
    ("pending", "max_batch", "joined", "left"),
    [
        (["b", "c", "d"], 8, ["a", "b", "c", "d"], []),
        (["b", "a", "c"], 8, ["a", "b", "c"], ["a"]),  # never two frames of one camera
        (["b", "c", "d"], 3, ["a", "b", "c"], ["d"]),  # at most max_batch
        (["b", "c*", "d"], 8, ["a", "b", "d"], ["c*"]),  # c* has another shape (a dynamic-size model)
        ([], 8, ["a"], []),
    ],
)
def test_gather_one_frame_per_camera(pending: list[str], max_batch: int, joined: list[str], left: list[str]) -> None:
    waiting = [request(c.rstrip("*"), (1, 3, 8, 16) if c.endswith("*") else (1, 3, 8, 8)) for c in pending]
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
    frames = tensors(reference, 4)
    alone = [reference.infer(t) for t in frames]
    shared = SharedModel(demo(), policy=BatchPolicy(max_wait_s=2.0))
    holds = [shared.attach(f"cam{i}") for i in range(4)]
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


# -- the daemon's cameras -------------------------------------------------------------------------


def camera_sections(count: int) -> list[PipelineSection]:
    return [PipelineSection(name=f"cam{i}", source=f"synthetic:{i + 1}", fps=10) for i in range(count)]


def test_four_cameras_hold_one_runtime_and_get_their_own_results(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    """One runtime object serves the four cameras; each camera's detections are those of its
    own frames (checked against a model of its own on the same images)."""
    versions = install_versions(tmp_path, keys, bundles)
    seen: dict[str, list] = {f"cam{i}": [] for i in range(4)}
    lock = threading.Lock()

    def sink_for(name: str):
        def sink(frame, detections) -> None:
            with lock:
                if len(seen[name]) < 5:
                    seen[name].append((frame.image.copy(), detections))

        return sink

    cameras = Cameras(camera_sections(4), probe(), "auto", sink_for)
    try:
        cameras.activate(versions[0])  # v1: INT8 Q/DQ ONNX with a dynamic batch axis
        wait_until(lambda: all(len(found) == 5 for found in seen.values()), 60, "five frames on every camera")
        holds = [cameras.get(f"cam{i}").detector for i in range(4)]
        assert all(isinstance(hold, CameraModel) for hold in holds)
        assert len({id(hold.runtime) for hold in holds}) == 1 and len({id(hold.shared) for hold in holds}) == 1
        assert {s.shared_by for s in cameras.stats()} == {4}
        runtime = holds[0].runtime
    finally:
        cameras.stop()
    assert runtime._session is None, "stopping the cameras closed the shared model"
    own = Detector(load_runtime("onnxruntime", runtime.model_path))
    for name, found in seen.items():
        for image, detections in found:
            alone = own.detect(image)
            assert len(alone) == len(detections), name
            np.testing.assert_allclose(alone.xyxy, detections.xyxy, atol=0.5)
            assert list(alone.class_id) == list(detections.class_id)
    assert not np.array_equal(seen["cam0"][0][0], seen["cam1"][0][0]), "each camera sees its own scene"
    own.close()


def test_hot_swap_and_rollback_replace_the_shared_model_of_every_camera(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path, keys, bundles)
    cameras = Cameras(camera_sections(3), probe(), "auto")
    names = [f"cam{i}" for i in range(3)]
    try:
        cameras.activate(versions[0])
        wait_until(lambda: all(s.frames > 2 for s in cameras.stats()), 60, "frames on v1")
        first = cameras.get("cam0").detector.shared
        cameras.activate(versions[1])  # the INT8 TFLite version, swapped in between frames
        wait_until(lambda: all(s.runtime == "litert" and s.frames > 0 for s in cameras.stats()), 60, "v2 everywhere")
        second = cameras.get("cam0").detector.shared
        assert second is not first and {id(cameras.get(n).detector.shared) for n in names} == {id(second)}
        wait_until(lambda: first.closed, 30, "v1's model closed once its last camera let go")
        before = {n: cameras.get(n).frames for n in names}
        cameras.activate(versions[0])  # a rollback: the same path back
        wait_until(lambda: all(s.runtime == "onnxruntime" for s in cameras.stats()), 60, "v1 again")
        wait_until(lambda: second.closed, 30, "v2's model closed")
        assert all(cameras.get(n).swaps == 2 and cameras.get(n).frames >= before[n] for n in names)
        assert [p.name for p in cameras.stats()] == names, "the same pipelines: capture never stopped"
    finally:
        cameras.stop()


def test_pause_cap_and_separate_models_still_work(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    versions = install_versions(tmp_path, keys, bundles)
    cameras = Cameras(camera_sections(2), probe(), "auto", options=CamerasSection(share_model=False))
    try:
        cameras.activate(versions[0])
        runtimes = {id(cameras.get(f"cam{i}").detector.runtime) for i in range(2)}
        assert len(runtimes) == 2, "share_model: false loads a model per camera"
        assert {s.shared_by for s in cameras.stats()} == {1}
    finally:
        cameras.stop()
    shared = Cameras(camera_sections(2), probe(), "auto")
    try:
        shared.activate(versions[0])
        wait_until(lambda: all(s.frames > 2 for s in shared.stats()), 60, "frames")
        shared.govern(fps_cap=2, paused=True)
        assert all(s.paused and s.max_fps == 2 for s in shared.stats())
        shared.govern(fps_cap=None, paused=False)
        counts = [s.frames for s in shared.stats()]
        wait_until(lambda: all(s.frames > c for s, c in zip(shared.stats(), counts, strict=True)), 60, "resumed")
    finally:
        shared.stop()
