"""The daemon's cameras: serve an installed version, swap to the next between frames, restart."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from agent.cameras import Cameras
from agent.config import PipelineSection
from agent.deploy import install
from agent.probe import probe
from agent.signing import load_public_key
from agent.store import Store
from tests.mqtt_tools import wait_until


def test_cameras_serve_swap_and_restart(tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path]) -> None:
    store = Store(tmp_path / "state")
    trusted = [load_public_key(keys["public"])]
    versions = []
    for name in ("v1", "v2"):
        deployment = install(bundles[name], store, probe(), trusted)
        assert deployment.state == "SUCCEEDED", deployment.error
        versions.append(store.versions / deployment.sha256)
    events: list[tuple[str, int]] = []
    sections = [
        PipelineSection(name="a", source="synthetic:1", fps=30),
        PipelineSection(name="b", source="synthetic:2"),
    ]
    cameras = Cameras(sections, probe(), "auto", lambda name: lambda frame, found: events.append((name, len(found))))
    try:
        cameras.activate(versions[0])
        wait_until(lambda: all(s["frames"] > 5 for s in cameras.stats()), 30, "frames on both cameras")
        assert {name for name, _ in events} == {"a", "b"} and max(n for _, n in events) > 0
        assert [s["runtime"] for s in cameras.stats()] == ["onnxruntime", "onnxruntime"]
        assert cameras.label(1) == "square"

        before = cameras.get("a").frames
        cameras.activate(versions[1])  # the int8 TFLite version, swapped in between frames
        wait_until(lambda: all(s["runtime"] == "litert" for s in cameras.stats()), 30, "the swap")
        assert cameras.get("a").frames > before and cameras.get("a").swaps == 1

        jpeg = cameras.get(None).snapshot()
        assert jpeg is not None
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (480, 640, 3)

        assert cameras.restart("b") == ["b"]
        wait_until(lambda: cameras.get("b").frames > 3, 30, "frames after the restart")
        assert cameras.get("b").stats()["runtime"] == "litert", "a restart keeps the serving model"
    finally:
        cameras.stop()
    assert cameras.stats() == []
