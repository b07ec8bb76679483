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
