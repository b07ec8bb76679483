"""The daemon's cameras: serve an installed version, swap to the next between frames, restart."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np

from agent.bundles.install import InstallPolicy, install
from agent.bundles.signing import load_public_key
from agent.bundles.store import Store
from agent.config.models import PipelineSection
from agent.hardware.probe import probe
from agent.serving.cameras import Cameras
from tests.mqtt_tools import wait_until


def install_versions(tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]) -> list[Path]:
    """Install the v1 (ONNX) and v2 (int8 TFLite) test bundles; their version folders."""
    store = Store(tmp_path / "state")
    trusted = [load_public_key(keys["public"])]
    versions = []
    for name in ("v1", "v2"):
        deployment = install(bundles[name], store, probe(), InstallPolicy(trusted=trusted))
        assert deployment.state == "SUCCEEDED", deployment.error
        versions.append(store.versions / deployment.sha256)
    return versions


def test_cameras_serve_swap_and_restart(tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]) -> None:
    versions = install_versions(tmp_path, keys, bundles)
    events: list[tuple[str, int]] = []
    sections = [
        PipelineSection(name="a", source="synthetic:1", fps=30),
        PipelineSection(name="b", source="synthetic:2"),
    ]
    cameras = Cameras(sections, probe(), "auto", lambda name: lambda frame, found: events.append((name, len(found))))
    try:
        cameras.activate(versions[0])
        wait_until(lambda: all(s.frames > 5 for s in cameras.stats()), 30, "frames on both cameras")
        assert {name for name, _ in events} == {"a", "b"} and max(n for _, n in events) > 0
        assert [s.runtime for s in cameras.stats()] == ["onnxruntime", "onnxruntime"]
        assert cameras.label(1) == "square"

        before = cameras.get("a").frames
        cameras.activate(versions[1])  # the int8 TFLite version, swapped in between frames
        wait_until(lambda: all(s.runtime == "litert" for s in cameras.stats()), 30, "the swap")
        assert cameras.get("a").frames > before and cameras.get("a").swaps == 1

        jpeg = cameras.get(None).snapshot()
        assert jpeg is not None
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (480, 640, 3)

        assert cameras.restart("b") == ["b"]
        wait_until(lambda: cameras.get("b").frames > 3, 30, "frames after the restart")
        assert cameras.get("b").stats().runtime == "litert", "a restart keeps the serving model"
    finally:
        cameras.stop()
    assert cameras.stats() == []


def test_camera_workers_follow_the_runtime(
    tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path], caplog
) -> None:
    """Two workers on ONNX Runtime (one intra-op thread each on 2 cores); a deployment to the
    LiteRT version restarts the camera with one worker instead of swapping, and back again."""
    versions = install_versions(tmp_path, keys, bundles)
    cameras = Cameras([PipelineSection(name="a", source="synthetic:1", fps=30, workers=2)], probe(), "auto")
    try:
        cameras.activate(versions[0])
        first = cameras.get("a")
        wait_until(lambda: first.frames > 5, 30, "frames with two workers")
        assert first.workers == 2 and first.stats().runtime == "onnxruntime"
        threads = first.detector.runtime._session.get_session_options().intra_op_num_threads
        assert threads == max(1, (os.cpu_count() or 1) // 2)

        cameras.activate(versions[1])
        second = cameras.get("a")
        assert second is not first and second.workers == 1 and second.stats().runtime == "litert"
        assert "litert serves one frame at a time; running 1 worker instead of 2" in caplog.text
        wait_until(lambda: second.frames > 3, 30, "frames after the restart")

        cameras.activate(versions[0])
        assert cameras.get("a").workers == 2
    finally:
        cameras.stop()


def test_the_agent_snapshot_without_a_broker(tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]) -> None:
    """The daemon's state is one typed value, readable with no broker configured (the status
    page serves it when the uplink is down)."""
    import json

    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent

    install_versions(tmp_path, keys, bundles)  # v1 then v2: v2 (int8 TFLite) is current, v1 previous
    config = AgentConfig.model_validate(
        {
            "device": {"id": "bench-7", "group": "lab"},
            "state_dir": str(tmp_path / "state"),
            "trust_keys": [str(keys["public"])],
            "pipelines": [{"name": "door", "source": "synthetic:3", "fps": 20}],
            "telemetry": {"interval_s": 0.2},
        }
    )
    agent = Agent(config, probe())
    agent.start()
    try:
        snapshot = wait_until(
            lambda: (s := agent.snapshot()).cameras and s.cameras[0].frames > 3 and s.system is not None and s,
            30,
            "frames and a system sample",
        )
    finally:
        agent.stop()
    assert (snapshot.device, snapshot.group, snapshot.state, snapshot.broker) == ("bench-7", "lab", "online", None)
    assert snapshot.bundle is not None and (snapshot.bundle.name, snapshot.bundle.version) == ("demo", "1.1.0")
    assert snapshot.previous is not None and snapshot.previous.version == "1.0.0"
    assert snapshot.serving is not None and snapshot.serving.runtime == "litert"
    assert snapshot.serving.artifact == "demo_detector_int8.tflite" and "litert on" in snapshot.serving.reason
    assert snapshot.deployment is not None and snapshot.deployment.state == "SUCCEEDED"
    assert snapshot.cameras[0].name == "door" and snapshot.cameras[0].source_status.state == "running"
    assert snapshot.fps > 0 and snapshot.system is not None and snapshot.system.process_rss_mb > 0
    document = json.loads(json.dumps(snapshot.to_json()))
    assert document["cameras"][0]["latency_ms"]["inference"]["p50"] > 0
    assert document["board"]["kind"] == snapshot.board.kind and document["broker"] is None
    assert agent.snapshot().state == "offline" and agent.snapshot().cameras == ()
