"""End to end over a real mosquitto: a version that went blind is rolled back by probation's
quality check (``PROBATION_BLIND``), the previous version serves again, and a restart of the
agent does not take the blind version again; a version whose boxes moved keeps its rates and is
rolled back by the agreement with the previous version (``--probation-agreement``), no shadow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import DEMO_MODELS
from testkit.bundles import bundle_of
from testkit.fleet import finished, online, push, serving
from testkit.onnx_models import altered

pytestmark = pytest.mark.usefixtures("operator_key")


@pytest.mark.long(seconds=30)
def test_blind_and_misplaced_versions_are_rolled_back_and_stay_rolled_back_after_a_restart(
    capsys, tmp_path: Path, broker, watcher, agents, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    # 5 s of probation at the camera's 10 FPS: 50 frames, past MIN_AFTER_FRAMES (30)
    agent = agents("dev1", deployments={"probation_s": 5.0})
    online(watcher, "dev1")
    good = push(capsys, broker, bundles["v1"], "device:dev1")
    assert finished(watcher, "dev1", good)["state"] == "SUCCEEDED"
    serving(watcher, "dev1", "1.0.0")  # five shapes a frame: far more than min_before (30) before the swap

    model = altered(DEMO_MODELS / "demo_detector.onnx", tmp_path / "blind.onnx", score_scale=0.2)
    blind = push(
        capsys, broker, bundle_of(model, tmp_path / "blind.bundle", keys["private"], version="1.2.0"), "device:dev1"
    )
    record = finished(watcher, "dev1", blind, 120)
    assert [h["state"] for h in record["history"]][-3:] == ["PROBATION", "FAILED", "ROLLED_BACK"], record
    assert record["error"]["code"] == "PROBATION_BLIND", record
    assert "camera cam0: 0 confident detections in" in record["error"]["message"]
    serving(watcher, "dev1", "1.0.0")
    on_disk = json.loads((tmp_path / "dev1" / "state" / "deployment.json").read_text())
    assert on_disk["quality"]["outcome"] == "blind" and on_disk["quality"]["min_ratio"] == 0.5
    assert on_disk["quality"]["cameras"][0]["after_per_frame"] == 0.0

    agent.stop()
    watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "offline")
    seen = len(watcher.all_json("edge/dev1/deployment"))
    agent.start()  # the blind document is still retained on the device's desired topic
    online(watcher, "dev1")
    serving(watcher, "dev1", "1.0.0")
    later = push(capsys, broker, bundles["v2"], "device:dev1")  # the device has acted on the blind one by then
    assert finished(watcher, "dev1", later)["state"] == "SUCCEEDED"
    again = [d["state"] for d in watcher.all_json("edge/dev1/deployment")[seen:] if d["id"] == blind]
    assert set(again) <= {"ROLLED_BACK"}, f"the blind version was taken again after the restart: {again}"

    model = altered(DEMO_MODELS / "demo_detector.onnx", tmp_path / "shifted.onnx", shift=0.2)
    shifted = bundle_of(model, tmp_path / "shifted.bundle", keys["private"], version="1.3.0")
    moved = push(capsys, broker, shifted, "device:dev1", "--probation-agreement", "0.5")
    record = finished(watcher, "dev1", moved, 120)
    assert [h["state"] for h in record["history"]][-3:] == ["PROBATION", "FAILED", "ROLLED_BACK"], record
    assert "SHADOW" not in [h["state"] for h in record["history"]]
    assert record["error"]["code"] == "PROBATION_BLIND", record
    assert record["error"]["message"].startswith("camera cam0: agreement "), "the rates alone kept it"
    agreement = record["quality"]["agreement"]
    assert agreement["outcome"] == "disagrees" and agreement["min_agreement"] == 0.5
    assert agreement["cameras"][0]["frames"] > 0
    serving(watcher, "dev1", "1.1.0")
