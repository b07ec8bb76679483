"""`agent.deployment.optimisation_report`: the daemon publishes its report and the tuning after a deployment."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit.agent_process import AgentProcess, agent_config
from testkit.broker import Broker, Watcher

from agent.cli import main


@pytest.mark.slow
@pytest.mark.long(seconds=20)
def test_the_daemon_publishes_its_report_and_the_tuning(
    tmp_path: Path, keys: dict[str, Path], demo_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = Broker(tmp_path / "broker").start()
    watcher = Watcher(broker, ["edge/#"])
    deployments = {"autotune": True, "report": True, "report_frames": 5, "autotune_frames": 5}
    agent = AgentProcess(agent_config(tmp_path, broker, "dev1", None, deployments=deployments)).start()
    try:
        watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "online", 60)
        assert main(["fleet", "push", str(demo_bundle), "--target", "device:dev1", "--broker", broker.url]) == 0
        record = watcher.wait_json("edge/dev1/deployment", lambda d: d["state"] == "SUCCEEDED", 120)
        choice = record["tuning"]["choice"]
        assert choice is not None and choice["runtime"] in ("onnxruntime", "litert", "openvino")
        report = watcher.wait_json("edge/dev1/report", lambda d: len(d["rows"]) > 0, 120)
        assert report["bundle"]["name"] == "demo" and report["choice"] == choice
        assert {r["runtime"] for r in report["rows"]} == {"tensorrt", "onnxruntime", "litert", "openvino", "tvm"}
        assert watcher.wait_json("edge/dev1/status", lambda d: d.get("runtime") == choice["runtime"], 60)
    finally:
        agent.stop()
        watcher.close()
        broker.stop()
