"""The daemon with task models, over a real mosquitto: a device running the demo segmentation
model and one running the demo pose model (signed bundles, `manifest.task` segment and pose),
each on a synthetic tracking camera with a line (the pose one on its keypoints): their object
events on ``edge/<device>/events`` carry the shapes, and their lines count. (Counts equal to the
scene's truth are checked in tests/agent/serving/test_events_tasks.py, on the scripted scene
that a daemon's camera cannot play.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from testkit import DEMO_MODELS
from testkit.broker import Broker, Watcher
from testkit.net import wait_until

from agent.bundles.archive import build_bundle, read_bundle_manifest
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.signing import load_private_key, load_public_key
from agent.bundles.store import Store
from agent.hardware.board import probe

ROAD = [[40, 240], [600, 240]]


def _install(tmp_path: Path, keys: dict[str, Path], device: str, model: str) -> str:
    bundle = tmp_path / f"{device}.bundle"
    build_bundle([DEMO_MODELS / model], bundle, name=device, key=load_private_key(keys["private"]))
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    deployment = install(bundle, Store(tmp_path / device / "state"), probe(), policy)
    assert deployment.state == "SUCCEEDED", deployment.error
    return read_bundle_manifest(bundle).manifest.task


def test_seg_and_pose_devices_send_events_with_their_shapes(
    tmp_path: Path, keys: dict[str, Path], broker: Broker, watcher: Watcher, agents: Callable[..., Any]
) -> None:
    assert _install(tmp_path, keys, "seg", "demo_segment.onnx") == "segment"
    assert _install(tmp_path, keys, "pose", "demo_pose.onnx") == "pose"
    for device, anchor in (("seg", "center"), ("pose", "keypoints:0,1,2")):
        line = {"name": f"{device}-road", "points": ROAD, "anchor": anchor}
        agents(device, cameras=[{"name": f"{device}-cam", "source": "tracking:3", "fps": 15, "lines": [line]}])

    def shaped(device: str, part: str) -> list[dict[str, Any]]:
        return [e for e in watcher.all_json(f"edge/{device}/events") if part in e.get("shape", {})]

    wait_until(lambda: shaped("seg", "polygons") and shaped("pose", "keypoints"), 120, "events with shapes")
    for event in shaped("seg", "polygons"):
        assert event["camera"] == event["pipeline"] == "seg-cam" and "keypoints" not in event["shape"]
        assert 0 < sum(len(p) for p in event["shape"]["polygons"]) <= 32
        x1, y1, x2, y2 = event["box"]
        assert all(x1 - 2 <= x <= x2 + 2 and y1 - 2 <= y <= y2 + 2 for p in event["shape"]["polygons"] for x, y in p)
    for event in shaped("pose", "keypoints"):
        assert event["label"] == "triangle" and len(event["shape"]["keypoints"]) == 3
        assert "polygons" not in event["shape"]

    def crossings(device: str) -> set[str]:
        return {c["line"] for e in watcher.all_json(f"edge/{device}/events") for c in e.get("lines", [])}

    wait_until(lambda: crossings("seg") and crossings("pose"), 120, "a crossing on each device's line")
    assert (crossings("seg"), crossings("pose")) == ({"seg-road"}, {"pose-road"})
