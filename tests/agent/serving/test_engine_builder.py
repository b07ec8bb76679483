"""`agent.serving.engine_builder` with the cameras, against the TensorRT test double: ONNX Runtime
serves until the engine swaps in; failed builds and wrong outputs fall back and say why."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from testkit import DEMO_MODELS, FAKES
from testkit.net import wait_until
from testkit.trt_double import TrtDouble

from agent.bundles.archive import build_bundle
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.signing import load_private_key, load_public_key
from agent.bundles.store import Store
from agent.config.models import AgentConfig, CameraSection
from agent.daemon.agent import Agent
from agent.daemon.documents import status_document
from agent.hardware.board import Board, probe
from agent.serving.cameras import Cameras
from pipelines.shared_model import CameraModel
from runtimes.tensorrt_backend import EngineNotReady, TensorRTBackend, TensorRTConfig, open_engine

JETSON = FAKES / "jetson-orin-nano"


@pytest.fixture
def jetson() -> Board:
    return probe(JETSON)


def _bundle(tmp_path: Path, keys: dict[str, Path], model: Path, version: str) -> Path:
    out = tmp_path / f"demo-{version}.bundle"
    build_bundle([model], out, name="demo", version=version, key=load_private_key(keys["private"]))
    return out


def _install(tmp_path: Path, keys: dict[str, Path], board: Board, config: AgentConfig, bundle: Path) -> Path:
    store = Store(config.state_dir)
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])], runtimes=config.runtime_settings())
    deployment = install(bundle, store, board, policy)
    assert deployment.state == "SUCCEEDED", deployment.error
    return store.versions / deployment.sha256


def _cameras(config: AgentConfig, board: Board) -> Cameras:
    return Cameras(config.cameras, board, "auto", settings=config.runtime_settings())


@pytest.fixture
def config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(state_dir=tmp_path / "state", cameras=[CameraSection(name="cam", source="synthetic:1", fps=30)])


def test_a_first_install_serves_on_onnxruntime_until_the_engine_swaps_in(
    trt_double: TrtDouble, tmp_path: Path, keys: dict[str, Path], jetson: Board, config: AgentConfig
) -> None:
    trt_double.internals.build_gate = gate = threading.Event()
    version = _install(
        tmp_path, keys, jetson, config, _bundle(tmp_path, keys, DEMO_MODELS / "demo_detector.onnx", "1.0.0")
    )
    cameras = _cameras(config, jetson)
    try:
        cameras.activate(version)
        camera = cameras.get("cam")
        assert camera.stats().runtime == "onnxruntime"
        status = cameras.engine_status()
        assert status is not None and status.state == "building" and status.artifact == "demo_detector.onnx"
        assert status.note == "onnxruntime serves until the engine is ready"
        wait_until(lambda: camera.frames > 10, 30, "frames on ONNX Runtime while the engine builds")
        assert camera.stats().runtime == "onnxruntime" and camera.swaps == 0

        gate.set()
        wait_until(lambda: camera.stats().runtime == "tensorrt", 30, "the swap to the engine")
        before = camera.frames
        wait_until(lambda: camera.frames > before + 5, 30, "frames on the engine")
        assert camera.swaps == 1 and camera.errors == 0
        status = cameras.engine_status()
        assert status is not None and status.state == "ready" and status.progress == 1.0
        assert status.message is not None and status.message.startswith("engine built:")
        assert cameras.choice is not None and cameras.choice.runtime == "tensorrt"
    finally:
        gate.set()
        cameras.stop()
    assert trt_double.memory.live["buffers"] == 0, "the swapped-out and stopped runtimes freed their GPU memory"


def test_an_update_keeps_the_previous_version_serving_until_its_engine_is_ready(
    trt_double: TrtDouble, tmp_path: Path, keys: dict[str, Path], jetson: Board, config: AgentConfig
) -> None:
    first = _install(
        tmp_path, keys, jetson, config, _bundle(tmp_path, keys, DEMO_MODELS / "demo_detector.onnx", "1.0.0")
    )
    cameras = _cameras(config, jetson)
    try:
        cameras.activate(first)
        camera = cameras.get("cam")
        wait_until(lambda: camera.stats().runtime == "tensorrt", 30, "the first engine")
        trt_double.internals.build_gate = gate = threading.Event()
        update = _bundle(tmp_path, keys, DEMO_MODELS / "demo_detector_int8_qdq.onnx", "1.1.0")
        second = _install(tmp_path, keys, jetson, config, update)
        cameras.activate(second)
        status = cameras.engine_status()
        assert status is not None and status.state == "building" and status.precision == "fp16"
        assert status.note == f"version {first.name[:12]} keeps serving until the engine is ready"
        before = camera.frames
        wait_until(lambda: camera.frames > before + 10, 30, "frames of the previous version")
        assert camera.stats().model == "demo_detector.onnx" and camera.stats().runtime == "tensorrt"
        gate.set()
        wait_until(lambda: camera.stats().model == "demo_detector_int8_qdq.onnx", 30, "the swap to the new engine")
        assert camera.stats().runtime == "tensorrt" and camera.errors == 0
        assert "int8" in (cameras.engine_status().message or ""), "a Q/DQ model builds an INT8 engine"
    finally:
        if trt_double.internals.build_gate is not None:
            trt_double.internals.build_gate.set()
        cameras.stop()


def test_a_failed_build_falls_back_to_onnxruntime_and_says_why(
    trt_double: TrtDouble, tmp_path: Path, keys: dict[str, Path], jetson: Board, config: AgentConfig
) -> None:
    trt_double.internals.UNSUPPORTED_OPS.add("Sigmoid")  # an operator this TensorRT cannot import
    version = _install(
        tmp_path, keys, jetson, config, _bundle(tmp_path, keys, DEMO_MODELS / "demo_detector.onnx", "1.0.0")
    )
    agent = Agent(config, jetson)
    agent.start()
    try:
        wait_until(lambda: (s := agent.cameras.engine_status()) is not None and s.state == "failed", 30, "the failure")
        snapshot = agent.snapshot()
        assert snapshot.engine is not None and snapshot.engine.error_code == "ENGINE_BUILD_FAILED"
        assert "TensorRT cannot parse demo_detector.onnx: node" in (snapshot.engine.message or "")
        assert "(Sigmoid " in (snapshot.engine.message or "")
        document = status_document(snapshot)
        assert document.engine is not None and document.engine.state == "failed" and document.runtime == "onnxruntime"
        camera = agent.cameras.get("cam")
        wait_until(lambda: camera.frames > 5, 30, "frames on ONNX Runtime")
        assert camera.stats().runtime == "onnxruntime"
        builds = len(trt_double.internals.builds)
        agent.cameras.activate(version)  # e.g. after a restart: the recorded failure is not rebuilt
        assert len(trt_double.internals.builds) == builds and agent.cameras.engine_status().state == "failed"
    finally:
        agent.stop()


@pytest.mark.parametrize(
    ("offset", "code", "why"),
    [
        # every output value off by 0.1: plausible detections, beyond the bundle's tolerance
        (0.1, "PARITY_FAILED", "the new TensorRT engine fails the bundle's parity check"),
        # every score 5: impossible detections on a blank frame (an engine built wrong)
        (5.0, "DECODER_MISMATCH", "the TensorRT engine fails the plausibility guard"),
    ],
)
def test_an_engine_with_wrong_outputs_is_not_served(
    trt_double: TrtDouble,
    tmp_path: Path,
    keys: dict[str, Path],
    jetson: Board,
    config: AgentConfig,
    offset: float,
    code: str,
    why: str,
) -> None:
    trt_double.internals.output_offset = offset
    version = _install(
        tmp_path, keys, jetson, config, _bundle(tmp_path, keys, DEMO_MODELS / "demo_detector.onnx", "1.0.0")
    )
    cameras = _cameras(config, jetson)
    try:
        cameras.activate(version)
        wait_until(lambda: (s := cameras.engine_status()) is not None and s.state == "failed", 30, "the check")
        status = cameras.engine_status()
        assert status is not None and status.error_code == code
        assert why in (status.message or "")
        camera = cameras.get("cam")
        wait_until(lambda: camera.swaps == 1, 30, "the version loaded again without the engine")
        before = camera.frames
        wait_until(lambda: camera.frames > before + 5, 30, "frames after it")
        assert camera.stats().runtime == "onnxruntime" and camera.swaps == 1
        with pytest.raises(EngineNotReady, match=f"its last build failed: {why}"):
            open_engine(DEMO_MODELS / "demo_detector.onnx", config.runtime_settings().of(TensorRTConfig))
    finally:
        cameras.stop()


@pytest.mark.slow
def test_cameras_sharing_one_model_swap_together_to_one_engine_and_back_on_a_failed_check(
    trt_double: TrtDouble, tmp_path: Path, keys: dict[str, Path], jetson: Board
) -> None:
    """Issue 15's one shared model per version is what swaps to the engine: both cameras hold
    the same `SharedModel` on ONNX Runtime, then the same one on the engine, served by a thread
    per camera, each with its own execution context on the one engine (a stream each); a second
    version whose engine fails the parity check swaps both back to one shared ONNX Runtime model."""
    config = AgentConfig(
        state_dir=tmp_path / "state",
        cameras=[CameraSection(name=n, source=f"synthetic:{i}", fps=30, workers=2) for i, n in enumerate("ab")],
    )
    trt_double.internals.build_gate = gate = threading.Event()
    first = _install(
        tmp_path, keys, jetson, config, _bundle(tmp_path, keys, DEMO_MODELS / "demo_detector.onnx", "1.0.0")
    )
    cameras = _cameras(config, jetson)
    try:
        cameras.activate(first)
        a, b = cameras.get("a"), cameras.get("b")
        assert isinstance(a.detector, CameraModel) and isinstance(b.detector, CameraModel)
        assert a.detector.shared is b.detector.shared and a.detector.runtime.name == "onnxruntime"
        gate.set()
        running = lambda: (cameras.get("a"), cameras.get("b"))  # noqa: E731 (restarted: 2 workers -> 1)
        wait_until(lambda: all(p.stats().runtime == "tensorrt" for p in running()), 30, "both cameras on the engine")
        a, b = running()
        assert isinstance(a.detector, CameraModel) and isinstance(b.detector, CameraModel)
        shared = a.detector.shared
        assert b.detector.shared is shared and isinstance(shared.runtime, TensorRTBackend)
        assert [s.shared_by for s in cameras.stats()] == [2, 2] and a.workers == b.workers == 1
        assert trt_double.memory.live["streams"] == 2, "an execution context and its stream per serving thread"
        before = (a.frames, b.frames)
        wait_until(lambda: a.frames > before[0] + 5 and b.frames > before[1] + 5, 30, "frames on the engine")
        assert a.errors == b.errors == 0

        trt_double.internals.output_offset = 0.1  # the next engine fails the bundle's parity check
        update = _bundle(tmp_path, keys, DEMO_MODELS / "demo_detector_int8_qdq.onnx", "1.1.0")
        cameras.activate(_install(tmp_path, keys, jetson, config, update))
        fallback = "demo_detector_int8_qdq.onnx"
        wait_until(lambda: all(p.stats().model == fallback for p in running()), 30, "the fallback")
        a, b = running()
        assert a.stats().runtime == b.stats().runtime == "onnxruntime"
        assert isinstance(a.detector, CameraModel) and isinstance(b.detector, CameraModel)
        assert a.detector.shared is b.detector.shared and shared.closed
        status = cameras.engine_status()
        assert status is not None and status.error_code == "PARITY_FAILED"
    finally:
        gate.set()
        cameras.stop()
    assert trt_double.memory.live["buffers"] == 0, "the shared engine freed its GPU memory"
