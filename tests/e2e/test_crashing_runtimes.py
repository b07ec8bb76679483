"""End to end: commands and the daemon with a runtime library that crashes on import or on load (stand-ins)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from testkit import DEMO_MODELS, REPO, standin_env
from testkit.agent_process import AgentProcess
from testkit.broker import Broker, Watcher
from testkit.fleet import finished, online, push, serving
from testkit.net import wait_until

ORT_VERSION = metadata.version("onnxruntime")


def edge_agent(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``edge-agent ARGS`` in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_probe_command_survives_a_library_that_crashes_on_import() -> None:
    done = edge_agent(standin_env("crash_on_import"), "probe", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    ort = report["runtimes"]["onnxruntime"]
    assert (ort["available"], ort["crashed"], ort["version"]) == (False, "SIGSEGV", ORT_VERSION)
    assert report["runtimes"]["litert"]["available"]
    assert report["selection"]["tflite"]["runtime"] == "litert"
    assert report["selection"]["onnx"]["runtime"] is None and "SIGSEGV" in report["selection"]["onnx"]["reason"]

    text = edge_agent(standin_env("crash_on_import"), "probe")
    assert text.returncode == 0 and f"unavailable: onnxruntime {ORT_VERSION} crashed on import (SIGSEGV)" in text.stdout


def test_a_one_shot_detect_that_crashes_leaves_the_traceback() -> None:
    """`detect` imports the library in its own process (its start-up is a benchmark goal): a
    crash ends it, with faulthandler's traceback naming the import."""
    done = edge_agent(standin_env("crash_on_import"), "detect", str(DEMO_MODELS / "demo_detector.onnx"), "x.png")
    assert done.returncode == -11
    assert "Fatal Python error: Segmentation fault" in done.stderr and "onnxruntime/__init__.py" in done.stderr


def _install(
    env: dict[str, str], bundle: Path, state: Path, trust: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return edge_agent(env, "install", str(bundle), "--state-dir", str(state), "--trust-key", str(trust), *extra)


def _status(state: Path) -> dict[str, object]:
    done = edge_agent(dict(os.environ), "status", "--state-dir", str(state), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_install_carries_on_when_the_runtime_crashes_on_import(tmp_path: Path, keys, bundles) -> None:
    env, state = standin_env("crash_on_import"), tmp_path / "state"
    onnx_only = _install(env, bundles["v1"], state, keys["public"])
    assert onnx_only.returncode == 1
    assert "ROLLED_BACK: NO_RUNTIME" in onnx_only.stderr and "crashed on import (SIGSEGV)" in onnx_only.stderr
    tflite = _install(env, bundles["v2"], state, keys["public"])
    assert tflite.returncode == 0, tflite.stderr
    assert _status(state)["current"] == {"name": "demo", "version": "1.1.0", "sha256": _sha(state)}


def _sha(state: Path) -> str:
    return os.readlink(state / "current").rsplit("/", 1)[-1]


def test_install_of_an_artifact_that_crashes_its_runtime_is_rolled_back(tmp_path: Path, keys, bundles) -> None:
    state = tmp_path / "state"
    assert _install(dict(os.environ), bundles["v2"], state, keys["public"]).returncode == 0
    crashing = _install(standin_env("crash_on_load"), bundles["v1"], state, keys["public"], "--allow-downgrade")
    assert crashing.returncode == 1
    assert "ROLLED_BACK: RUNTIME_CRASHED" in crashing.stderr
    assert f"onnxruntime {ORT_VERSION} crashed (SIGILL) while loading demo_detector_int8_qdq.onnx" in crashing.stderr
    status = _status(state)
    assert status["current"]["version"] == "1.1.0"  # type: ignore[index]
    assert status["deployment"]["error"]["code"] == "RUNTIME_CRASHED"  # type: ignore[index]


def test_the_daemon_reports_crashed_runtimes_and_keeps_serving(
    capsys, broker: Broker, watcher: Watcher, agents, operator_key: Path, bundles: dict[str, Path]
) -> None:
    """Over a real broker: one device whose onnxruntime crashes on import (status says so; the
    ONNX-only version is refused, the TFLite one serves), one whose onnxruntime crashes on a
    model (that version ends RUNTIME_CRASHED; the device serves on and stays online)."""
    crashing_import = agents("imports", env=standin_env("crash_on_import"))
    crashing_load = agents("loads", env=standin_env("crash_on_load"))

    def deploy(bundle: Path, device: str) -> dict[str, Any]:
        deployment = push(capsys, broker, bundle, f"device:{device}", "--allow-downgrade")
        return finished(watcher, device, deployment, 120)

    status = online(watcher, "imports", 90)
    ort = status["runtimes"]["onnxruntime"]
    assert (ort["available"], ort["crashed"], ort["version"]) == (False, "SIGSEGV", ORT_VERSION)
    assert status["runtimes"]["litert"]["available"]
    refused = deploy(bundles["v1"], "imports")
    assert refused["state"] == "ROLLED_BACK" and refused["error"]["code"] == "NO_RUNTIME"
    assert "SIGSEGV" in refused["error"]["message"]
    assert deploy(bundles["v2"], "imports")["state"] == "SUCCEEDED"

    online(watcher, "loads", 90)
    assert deploy(bundles["v2"], "loads")["state"] == "SUCCEEDED"
    crashed = deploy(bundles["v1"], "loads")
    assert crashed["state"] == "ROLLED_BACK" and crashed["error"]["code"] == "RUNTIME_CRASHED"
    assert "SIGILL" in crashed["error"]["message"]

    for device in ("imports", "loads"):
        status = serving(watcher, device, "1.1.0")
        assert status["state"] == "online" and status["runtime"] == "litert"
    assert crashing_import.alive() and crashing_load.alive()
    assert "killed its probe process (SIGSEGV)" in crashing_import.output()
    assert "Fatal Python error: Illegal instruction" in crashing_load.output(), "the child's traceback is logged"


def test_the_daemon_serves_on_when_the_current_version_crashes_its_runtime(tmp_path: Path, keys, bundles) -> None:
    """The current version's artifact crashes its runtime after a library change: the daemon
    starts, says why it cannot serve, and stays up (no crash loop)."""
    state, config = tmp_path / "state", tmp_path / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "device": {"id": "dev"},
                "state_dir": str(state),
                "trust_keys": [str(keys["public"])],
                "cameras": [{"name": "cam0", "source": "synthetic", "max_fps": 10}],
            }
        )
    )
    assert _install(dict(os.environ), bundles["v1"], state, keys["public"]).returncode == 0
    agent = AgentProcess(config, standin_env("crash_on_load")).start()
    try:
        wait_until(lambda: "cannot serve the current version" in agent.output(), 90, "the serving error")
        assert agent.alive()
        assert "RuntimeCrashed" not in agent.output() and "crashed (SIGILL) while loading" in agent.output()
    finally:
        assert agent.stop() == 0
