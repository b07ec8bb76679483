"""Native libraries that crash: probed and first loaded in a child process, so `probe`, an
install and the daemon carry on and say which library died, how, and its version.

The crashing libraries are stand-ins (test doubles, tests/standins/README.md): a package named
``onnxruntime`` put first on ``PYTHONPATH`` that kills its process with SIGSEGV on import
(`crash_on_import`), or with SIGILL when a model is loaded (`crash_on_load`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtimes.base import ModelLoadError
from runtimes.isolation import ChildResult, ChildRunner, IsolationUnavailable, RuntimeCrashed, exit_description
from runtimes.registry import load_runtime
from tests.conftest import DEMO_MODELS, REPO
from tests.fleet_helpers import finished, online, push, serving
from tests.mqtt_tools import AgentProcess, Broker, Watcher, wait_until

STANDINS = Path(__file__).resolve().parent / "standins"
ORT_VERSION = metadata.version("onnxruntime")


def standin_env(folder: str) -> dict[str, str]:
    """This environment with the stand-in `folder` first on ``PYTHONPATH``."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(STANDINS / folder), str(REPO)])}


class CountingRunner(ChildRunner):
    """A real `ChildRunner` that also records the arguments of every child it starts."""

    def __init__(self, **options: object) -> None:
        super().__init__(**options)  # type: ignore[arg-type]
        self.started: list[list[str]] = []

    def run(self, args: Sequence[str], timeout_s: float) -> ChildResult:
        self.started.append(list(args))
        return super().run(args, timeout_s)


def edge_agent(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``edge-agent ARGS`` in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "agent.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [(-11, "SIGSEGV"), (-4, "SIGILL"), (-6, "SIGABRT"), (1, "exit status 1"), (None, "timeout"), (-200, "signal 200")],
)
def test_how_a_child_ended_reads_as_its_signal(returncode: int | None, expected: str) -> None:
    assert exit_description(returncode) == expected


def test_a_library_that_crashes_on_import_is_unavailable_and_the_others_are_probed() -> None:
    runner = CountingRunner(env=standin_env("crash_on_import"))
    infos = runner.probe(["litert", "onnxruntime", "tensorrt"])
    ort = infos["onnxruntime"]
    assert not ort.available and ort.crashed == "SIGSEGV" and ort.version == ORT_VERSION
    assert f"onnxruntime {ORT_VERSION} crashed on import (SIGSEGV)" in (ort.reason or "")
    assert infos["litert"].available and infos["litert"].crashed is None
    assert not infos["tensorrt"].available and infos["tensorrt"].crashed is None, "probed after the crash"
    assert runner.started == [["probe", "litert", "onnxruntime", "tensorrt"], ["probe", "tensorrt"]]

    assert runner.probe(["onnxruntime", "litert"]) == {"onnxruntime": ort, "litert": infos["litert"]}
    assert len(runner.started) == 2, "probed once per process"


def test_a_healthy_probe_takes_one_child_and_imports_nothing_here() -> None:
    runner = CountingRunner()
    infos = runner.probe(["onnxruntime", "litert"])
    assert infos["onnxruntime"].available and "CPUExecutionProvider" in infos["onnxruntime"].devices
    assert infos["onnxruntime"].version == ORT_VERSION and infos["litert"].available
    assert runner.started == [["probe", "onnxruntime", "litert"]]
    assert runner.probe(["litert"]) == {"litert": infos["litert"]} and len(runner.started) == 1


def test_a_model_whose_load_crashes_raises_runtime_crashed_once_checked(tmp_path: Path) -> None:
    runner = CountingRunner(env=standin_env("crash_on_load"))
    model = tmp_path / "model.onnx"
    model.write_bytes((DEMO_MODELS / "demo_detector.onnx").read_bytes())
    with pytest.raises(RuntimeCrashed, match=r"crashed \(SIGILL\) while loading model\.onnx") as crash:
        runner.check_load("onnxruntime", model, "{}")
    assert (crash.value.runtime, crash.value.how) == ("onnxruntime", "SIGILL")
    assert crash.value.library == f"onnxruntime {ORT_VERSION}"
    with pytest.raises(RuntimeCrashed):
        runner.check_load("onnxruntime", model, "{}")
    assert len(runner.started) == 1, "each file version is checked once"
    os.utime(model, ns=(0, 0))  # touched, the same bytes: not checked again
    copy = tmp_path / "other-device" / "model.onnx"  # a simulated device's copy in its own store
    copy.parent.mkdir()
    copy.write_bytes(model.read_bytes())
    with pytest.raises(RuntimeCrashed, match=r"while loading model\.onnx"):
        runner.check_load("onnxruntime", copy, "{}")
    assert len(runner.started) == 1, "the same content is checked once"
    model.write_bytes(model.read_bytes() + b"\0")  # another version of the file: checked again
    with pytest.raises(RuntimeCrashed):
        runner.check_load("onnxruntime", model, "{}")
    with pytest.raises(RuntimeCrashed):
        runner.check_load("onnxruntime", copy, '{"intra_op_threads": 1}')  # other settings: checked again
    assert len(runner.started) == 3


def test_a_model_that_loads_or_is_refused_passes_the_check(tmp_path: Path) -> None:
    runner = ChildRunner()
    runner.check_load("litert", DEMO_MODELS / "demo_detector_int8.tflite", "{}")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    runner.check_load("onnxruntime", junk, "{}")  # the backend's own error is the caller's to raise
    with pytest.raises(ModelLoadError, match="ONNX Runtime cannot load"):
        load_runtime("onnxruntime", junk)
    runner.check_load("onnxruntime", tmp_path / "missing.onnx", "{}")  # the load reports the missing file


def test_a_child_that_cannot_start_is_reported_as_such(tmp_path: Path) -> None:
    with pytest.raises(IsolationUnavailable, match="cannot start"):
        ChildRunner(python=[str(tmp_path / "no-python")]).probe(["litert"])
    with pytest.raises(IsolationUnavailable, match=r"ended \(exit status 1\) before it started"):
        ChildRunner(python=["false"]).probe(["litert"])


def test_a_library_that_hangs_on_import_is_given_up_on(tmp_path: Path) -> None:
    """A probe process that never answers is killed after its timeout (15 s here, generous so a
    slow start is not mistaken for the hang)."""
    hang = tmp_path / "onnxruntime"
    hang.mkdir()
    (hang / "__init__.py").write_text('"""A stand-in for onnxruntime that never finishes importing."""\n' + HANG)
    runner = ChildRunner(env={**os.environ, "PYTHONPATH": str(tmp_path)}, probe_timeout_s=15)
    infos = runner.probe(["onnxruntime", "litert"])
    ort = infos["onnxruntime"]
    assert ort.crashed == "timeout" and "did not finish within 15 s" in (ort.reason or "")
    assert infos["litert"].available


HANG = "import time\ntime.sleep(3600)\n"


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
                "pipelines": [{"name": "cam0", "source": "synthetic", "max_fps": 10}],
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
