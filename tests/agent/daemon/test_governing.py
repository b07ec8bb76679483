"""The governor at work in a running agent (`agent.daemon.governing`): a heating fake zone caps the FPS,
sets the fan and pauses, a critical battery stops inference cleanly; a camera with a motion gate is
slowed where nothing moves before its FPS is capped."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gpiozero.pins.mock import MockFactory, MockPWMPin
from testkit import DEMO_MODELS, FAKES
from testkit.agent_process import AgentProcess, agent_config
from testkit.broker import Broker, Watcher
from testkit.net import wait_until

from agent.bundles.archive import build_bundle
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.signing import load_private_key, load_public_key
from agent.bundles.store import Store
from agent.config.models import AgentConfig
from agent.daemon.agent import Agent
from agent.hardware.board import probe


def tree_copy(tmp_path: Path, tree: str) -> Path:
    return Path(shutil.copytree(FAKES / tree, tmp_path / tree))


def install_two_artifacts(state_dir: Path, keys: dict[str, Path], tmp_path: Path, board: Any) -> None:
    """A version with an FP32 ONNX artifact (served normally here) and an INT8 TFLite one (the
    lighter artifact), installed as current."""
    bundle = tmp_path / "demo-2.0.0.bundle"
    models = [DEMO_MODELS / "demo_detector.onnx", DEMO_MODELS / "demo_detector_int8.tflite"]
    build_bundle(models, bundle, name="demo", version="2.0.0", key=load_private_key(keys["private"]))
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    deployment = install(bundle, Store(state_dir), board, policy)
    assert deployment.state == "SUCCEEDED", deployment.error


def camera(document: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    """The document's first camera, or the one called `name` ({} when there is none)."""
    found = [c for c in document["cameras"] if name is None or c["name"] == name]
    return dict(found[0]) if found else {}


def test_temperature_caps_fps_sets_the_fan_pauses_and_recovers(
    tmp_path: Path, broker: Broker, watcher: Watcher, keys: dict[str, Path]
) -> None:
    tree = tree_copy(tmp_path, "jetson-orin-nano")
    hottest = tree / "sys/class/thermal/thermal_zone8/temp"  # tj-thermal
    board = probe(tree)
    state_dir = tmp_path / "state"
    install_two_artifacts(state_dir, keys, tmp_path, board)
    config = AgentConfig.model_validate(
        {
            "device": {"id": "hot-1"},
            "state_dir": str(state_dir),
            "trust_keys": [str(keys["public"])],
            "mqtt": {"broker": broker.url, "reconnect_min_s": 0.2},
            "cameras": [{"name": "cam0", "source": "synthetic", "fps": 15, "max_fps": 12}],
            "telemetry": {"interval_s": 0.3},
            "governor": {
                "thermal": {"warm_c": 60, "hot_c": 70, "critical_c": 85, "hysteresis_c": 3, "min_dwell_s": 2},
                "actions": {"hot": {"fps_cap": 3, "fan_percent": 100, "lighter_artifact": True}},
                "fan": {"kind": "gpio", "pin": 18},
            },
        }
    )
    factory = MockFactory(pin_class=MockPWMPin)
    agent = Agent(config, board, root=tree, pin_factory=factory)
    topic = "edge/hot-1/telemetry"
    agent.start()
    try:
        normal = watcher.wait_json(topic, lambda d: camera(d).get("fps", 0) > 6)
        assert normal["governor"]["level"] == "NORMAL" and normal["governor"]["actions"]["fan"] == 0
        assert normal["sensors"]["temp_c"] == 48.5 and normal["sensors"]["power_w"] == 5.802
        assert normal["energy_mj_per_frame"] == round(5.802 / normal["fps"] * 1000, 1)
        assert factory.pin(18).state == 0
        assert camera(normal)["max_fps"] == 12

        hottest.write_text("75000\n")
        hot = watcher.wait_json(topic, lambda d: d["governor"]["level"] == "HOT" and camera(d).get("fps", 99) <= 3.2)
        assert hot["governor"]["actions"] == {
            "fps_cap": 3.0,
            "gate_slowdown": 1.0,  # `hot:` set here replaces the default's x4 whole
            "gated_fps_cap": None,
            "paused": False,
            "fan": 100.0,
            "artifact": "lighter",
            "stopped": False,
        }
        assert camera(hot)["max_fps"] == 3.0
        assert factory.pin(18).state == 1.0
        status = watcher.wait_json("edge/hot-1/status", lambda d: d["temperature_c"] == 75.0)
        assert status["governor"]["level"] == "HOT" and status["runtime"] == "litert"  # the INT8 TFLite

        hottest.write_text("90000\n")
        critical = watcher.wait_json(topic, lambda d: d["governor"]["level"] == "CRITICAL" and camera(d)["paused"])
        frames = camera(critical)["frames"]
        later = watcher.wait_json(topic, lambda d: d["ts"] > critical["ts"] + 1.0)
        assert camera(later)["frames"] <= frames + 1  # a frame in flight may finish, no more

        hottest.write_text("40000\n")
        watcher.wait_json(topic, lambda d: d["governor"]["level"] == "NORMAL" and camera(d).get("fps", 0) > 6)
        assert factory.pin(18).state == 0
        recovered = watcher.wait_json("edge/hot-1/status", lambda d: d["temperature_c"] == 47.5)  # cpu-thermal
        assert recovered["runtime"] == "onnxruntime" and recovered["governor"]["level"] == "NORMAL"
        assert camera(watcher.json(topic))["max_fps"] == 12
    finally:
        agent.stop()
    events = [e for e in watcher.all_json("edge/hot-1/events") if e.get("type") == "governor"]
    assert [(e["previous"], e["level"]) for e in events] == [
        ("NORMAL", "HOT"),
        ("HOT", "CRITICAL"),
        ("CRITICAL", "NORMAL"),
    ]
    assert "75.0 °C reached HOT at 70.0 °C" in events[0]["reason"]


def test_a_critical_battery_stops_inference_cleanly_with_a_final_status(
    tmp_path: Path, broker: Broker, watcher: Watcher, keys: dict[str, Path]
) -> None:
    tree = tree_copy(tmp_path, "laptop-battery")
    capacity = tree / "sys/class/power_supply/BAT0/capacity"
    state_dir = tmp_path / "bat-1" / "state"
    install_two_artifacts(state_dir, keys, tmp_path, probe(tree))
    governor = {"battery": {"low_pct": 20, "critical_pct": 5, "min_dwell_s": 1}}
    config = agent_config(tmp_path, broker, "bat-1", keys["public"], governor=governor)
    agent = AgentProcess(config, args=("--root", str(tree))).start()
    topic = "edge/bat-1/telemetry"
    try:
        running = watcher.wait_json(topic, lambda d: camera(d).get("fps", 0) > 3)
        battery = running["sensors"]["battery"]
        assert battery["percent"] == 57.0 and battery["status"] == "Discharging"
        assert running["energy_mj_per_frame"] == round(12.119 / running["fps"] * 1000, 1)

        capacity.write_text("15\n")
        low = watcher.wait_json(topic, lambda d: d["governor"]["level"] == "LOW")
        assert low["governor"]["actions"]["fps_cap"] == 2.0

        capacity.write_text("4\n")
        final = watcher.wait_json(
            "edge/bat-1/status", lambda d: d["governor"] is not None and d["governor"]["level"] == "CRITICAL"
        )
        assert final["state"] == "online" and final["cameras"] == [] and final["fps"] == 0
        assert final["governor"]["reason"] == "battery 4 % at or below 5 %: CRITICAL"
        stopped = watcher.wait_json(topic, lambda d: d["governor"]["actions"]["stopped"] and not d["cameras"])
        assert stopped["governor"]["battery"] == "CRITICAL" and agent.alive()

        capacity.write_text("60\n")  # charged again
        watcher.wait_json(topic, lambda d: d["governor"]["level"] == "NORMAL" and camera(d).get("fps", 0) > 3)
    finally:
        assert agent.stop() == 0, agent.output()
    output = agent.output()
    assert "governor: stopping inference (battery 4 % at or below 5 %: CRITICAL)" in output
    assert "governor: starting inference again" in output
    assert wait_until(lambda: watcher.json("edge/bat-1/status")["state"] == "offline", 10, "offline")


def gate_of(document: dict[str, Any]) -> tuple[float, float, float | None] | None:
    """The gated camera's idle interval and keepalive in force and its FPS cap (None: no gate yet)."""
    gated = camera(document, "gated")
    gate = gated.get("gate")
    return (gate["idle_interval_s"], gate["keepalive_fps"], gated["max_fps"]) if gate else None


def test_heat_slows_a_motion_gate_before_it_caps_the_fps_and_cooling_restores_it(
    tmp_path: Path, broker: Broker, watcher: Watcher, keys: dict[str, Path]
) -> None:
    """The default actions on a fake Orin Nano: WARM stretches the gated camera's idle interval and
    keepalive period x2 and caps nothing; HOT x4, and caps the camera without a gate only."""
    tree = tree_copy(tmp_path, "jetson-orin-nano")
    hottest = tree / "sys/class/thermal/thermal_zone8/temp"  # tj-thermal
    board = probe(tree)
    state_dir = tmp_path / "state"
    install_two_artifacts(state_dir, keys, tmp_path, board)
    motion = {"enabled": True, "idle_interval_s": 2.0, "keepalive_fps": 2.0}
    config = AgentConfig.model_validate(
        {
            "device": {"id": "gate-1"},
            "state_dir": str(state_dir),
            "trust_keys": [str(keys["public"])],
            "mqtt": {"broker": broker.url, "reconnect_min_s": 0.2},
            "cameras": [
                {"name": "gated", "source": "synthetic", "fps": 10, "max_fps": 8, "motion": motion},
                {"name": "plain", "source": "synthetic", "fps": 10, "max_fps": 8},
            ],
            "telemetry": {"interval_s": 0.3},
            "governor": {"thermal": {"warm_c": 60, "hot_c": 70, "critical_c": 85, "hysteresis_c": 3, "min_dwell_s": 0}},
        }
    )
    agent = Agent(config, board, root=tree, pin_factory=MockFactory(pin_class=MockPWMPin))
    topic = "edge/gate-1/telemetry"
    agent.start()
    try:
        normal = watcher.wait_json(topic, lambda d: d["governor"] is not None and gate_of(d) is not None)
        assert gate_of(normal) == (2.0, 2.0, 8.0) and camera(normal, "plain")["max_fps"] == 8.0

        hottest.write_text("65000\n")
        warm = watcher.wait_json(topic, lambda d: d["governor"]["level"] == "WARM" and gate_of(d) == (4.0, 1.0, 8.0))
        assert camera(warm, "plain")["max_fps"] == 8.0  # nothing capped yet
        assert warm["governor"]["actions"]["gate_slowdown"] == 2.0 and warm["governor"]["actions"]["fps_cap"] is None
        assert warm["governor"]["reason"].endswith("motion-gated cameras: idle interval and keepalive period x2")

        hottest.write_text("75000\n")
        hot = watcher.wait_json(topic, lambda d: d["governor"]["level"] == "HOT" and gate_of(d) == (8.0, 0.5, 8.0))
        assert camera(hot, "plain")["max_fps"] == 5.0  # the camera without a gate is capped as before
        assert (hot["governor"]["actions"]["fps_cap"], hot["governor"]["actions"]["gated_fps_cap"]) == (5.0, None)

        hottest.write_text("40000\n")
        cooled = watcher.wait_json(
            topic, lambda d: d["governor"]["level"] == "NORMAL" and gate_of(d) == (2.0, 2.0, 8.0)
        )
        assert camera(cooled, "plain")["max_fps"] == 8.0 and cooled["governor"]["actions"]["gate_slowdown"] == 1.0
    finally:
        agent.stop()
    events = [e for e in watcher.all_json("edge/gate-1/events") if e.get("type") == "governor"]
    assert [(e["previous"], e["level"]) for e in events] == [("NORMAL", "WARM"), ("WARM", "HOT"), ("HOT", "NORMAL")]
    assert "motion-gated cameras: idle interval and keepalive period x4" in events[1]["reason"]
