"""End to end: a device behind NAT in Prometheus, its telemetry over MQTT through Debian's
prometheus-mqtt-exporter, configured by deploy/prometheus/mqtt-exporter.yaml and scraped with
deploy/prometheus/mqtt-exporter.scrape.yml (docs/integrations.md, "Devices behind NAT").

An agent of this process on the Jetson Orin Nano's fake tree (temperatures, power rails), its
governor's HOT set below the tree's temperature, publishes telemetry to a real mosquitto; the
exporter subscribes to it there and Debian's prometheus scrapes the exporter. What is checked:
the bridged series have the device as `device` and `instance`, the names, units and values of
the agent's own /metrics, and edge-agent.rules.yml's EdgeAgentHot expression picks the device."""

from __future__ import annotations

import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from testkit import FAKES, REPO
from testkit.broker import Broker
from testkit.needs import missing
from testkit.net import free_ports, wait_until
from testkit.page import http

from agent.config.models import AgentConfig
from agent.daemon.agent import Agent
from agent.hardware.board import probe

DEPLOY = REPO / "deploy" / "prometheus"
DEVICE = "orin-nat"
#: metrics the bridge carries with the name, unit and (on a fake tree) value of the device's /metrics
SAME_VALUE = ("edge_agent_temperature_max_celsius", "edge_agent_power_watts", "edge_agent_disk_size_bytes")


@dataclass
class Bridge:
    prometheus: str
    page: str  # the agent's own status page, for its /metrics

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = http(f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer.status == 200, f"{expr}: {answer.body!r}"
        return answer.json()["data"]["result"]  # type: ignore[no-any-return]

    def bridged(self, name: str) -> dict[str, Any] | None:
        series = self.query(f'{name}{{job="edge-agent-mqtt"}}')
        return series[0] if series else None

    def own(self) -> dict[str, float]:
        """The agent's /metrics, unlabelled gauges by name."""
        text = http(self.page + "/metrics").body.decode()
        return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}


def _started(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log.open("wb"))


def _alive(process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    if process.poll() is not None:
        raise AssertionError(f"{what} exited {process.returncode}: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    exporter_binary, prometheus_binary = shutil.which("prometheus-mqtt-exporter"), shutil.which("prometheus")
    if exporter_binary is None or prometheus_binary is None:
        missing("prometheus", "Debian's prometheus and prometheus-mqtt-exporter are needed (apt-get install ...)")
    folder = tmp_path_factory.mktemp("bridge")
    broker = Broker(folder / "broker").start()
    exporter_config = yaml.safe_load((DEPLOY / "mqtt-exporter.yaml").read_text())
    exporter_config["mqtt"]["server"] = f"tcp://127.0.0.1:{broker.port}"
    (folder / "exporter.yaml").write_text(yaml.safe_dump(exporter_config))
    exporter_port, page_port, prometheus_port = free_ports(3)
    job = yaml.safe_load((DEPLOY / "mqtt-exporter.scrape.yml").read_text())[0]
    job["static_configs"] = [{"targets": [f"127.0.0.1:{exporter_port}"]}]
    prometheus_config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(DEPLOY / "edge-agent.rules.yml")],
        "scrape_configs": [job],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(prometheus_config))
    tree = FAKES / "jetson-orin-nano"
    config = {
        "device": {"id": DEVICE},
        "state_dir": str(folder / "state"),
        "mqtt": {"broker": broker.url, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "cameras": [],
        "telemetry": {"interval_s": 1.0},
        "governor": {"thermal": {"warm_c": 30, "hot_c": 40, "critical_c": 95}},
        "status_page": {"listen": f"127.0.0.1:{page_port}"},
    }
    agent = Agent(AgentConfig.model_validate(config), probe(tree), root=tree)
    exporter = _started(
        [exporter_binary, "-config", str(folder / "exporter.yaml"), "-listen-address", "127.0.0.1",
         "-listen-port", str(exporter_port)],
        folder / "exporter.log",
    )  # fmt: skip
    prometheus = _started(
        [prometheus_binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}", "--storage.tsdb.retention.time=1h"],
        folder / "prometheus.log",
    )  # fmt: skip
    try:
        agent.start()
        found = Bridge(f"http://127.0.0.1:{prometheus_port}", f"http://127.0.0.1:{page_port}")

        def scraped() -> bool:
            _alive(exporter, folder / "exporter.log", "prometheus-mqtt-exporter")
            _alive(prometheus, folder / "prometheus.log", "prometheus")
            try:  # Prometheus answers 503 until it is ready: wait for that first
                if http(found.prometheus + "/-/ready").status != 200:
                    return False
                return found.bridged("edge_agent_temperature_max_celsius") is not None
            except OSError:
                return False

        wait_until(scraped, 90, "the bridged temperature in Prometheus", interval=0.5)
        yield found
    finally:
        for process in (prometheus, exporter):
            process.terminate()
            process.wait(30)
        agent.stop()
        broker.stop()


def test_bridged_series_name_the_device_and_match_its_own_metrics(bridge: Bridge) -> None:
    own = bridge.own()
    for name in (*SAME_VALUE, "edge_agent_cpu_percent"):
        series = wait_until(lambda name=name: bridge.bridged(name), 30, f"{name} bridged", interval=0.5)
        labels = {k: v for k, v in series["metric"].items() if k != "__name__"}
        assert labels == {"device": DEVICE, "instance": DEVICE, "job": "edge-agent-mqtt"}, name
        if name in SAME_VALUE:  # the fake tree's readings and the disk's size do not change
            assert float(series["value"][1]) == pytest.approx(own[name]), name
    assert own["edge_agent_temperature_max_celsius"] > 40, "the fake Orin is above the HOT set in the fixture"


def test_the_governor_level_and_the_hot_alert_reach_prometheus(bridge: Bridge) -> None:
    level = wait_until(lambda: bridge.query('edge_agent_governor_level{job="edge-agent-mqtt"} == 2'), 30, "HOT")
    assert [s["metric"]["device"] for s in level] == [DEVICE]
    rules = yaml.safe_load((DEPLOY / "edge-agent.rules.yml").read_text())["groups"]
    hot = next(r["expr"] for g in rules for r in g["rules"] if r.get("alert") == "EdgeAgentHot")
    assert [s["metric"]["instance"] for s in bridge.query(hot)] == [DEVICE]
    pending = wait_until(lambda: bridge.query('ALERTS{alertname="EdgeAgentHot"}'), 30, "EdgeAgentHot pending")
    assert [(a["metric"]["instance"], a["metric"]["alertstate"]) for a in pending] == [(DEVICE, "pending")]
