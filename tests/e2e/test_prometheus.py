"""End to end: Debian's prometheus scrapes running agents' /metrics and evaluates
deploy/prometheus/edge-agent.rules.yml; every PromQL expression of the Grafana dashboard
(deploy/grafana/edge-agent-dashboard.json) returns series from it.

The fleet: two agents of this process on fake boards (a laptop on battery with a camera, a line and
a zone, its page behind HTTP Basic; a Jetson Orin Nano with power rails, no camera), and three
devices of the fleet simulator (agent/daemon/simulation.py), all on one real mosquitto."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit import FAKES, REPO
from testkit.broker import Broker
from testkit.bundles import install_versions
from testkit.needs import missing
from testkit.net import free_ports
from testkit.net import wait_until as _wait_until
from testkit.page import basic, http
from testkit.quality_records import quality, shadow

from agent.bundles.record import Deployment, State
from agent.config.models import AgentConfig
from agent.daemon.agent import Agent
from agent.daemon.simulation import FleetSettings, SimulatedFleet
from agent.hardware.board import probe

RULES = REPO / "deploy" / "prometheus" / "edge-agent.rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "edge-agent-dashboard.json"
SIMULATED = ("sim-1", "sim-2", "sim-3")
JUDGED = Deployment(
    id="demo-2.0.0-q", sha256="c" * 64, state=State.SUCCEEDED, name="demo", version="2.0.0",
    history=((State.QUEUED, 1000.0), (State.SUCCEEDED, 1400.0)), shadow=shadow(),
    quality=quality(agreement=shadow()),
)  # fmt: skip
PASSWORD = "s3cret pass"


@dataclass
class Fleet:
    prometheus: str  # http://127.0.0.1:PORT
    laptop: Agent
    laptop_page: str
    targets: dict[str, str]  # device -> host:port
    rolled_back: bool = False

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = http(f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert answer.status == 200, f"{expr}: {answer.body!r}"
        document = answer.json()
        assert document["status"] == "success", document
        return document["data"]["result"]  # type: ignore[no-any-return]

    def rules(self) -> list[dict[str, Any]]:
        groups = http(self.prometheus + "/api/v1/rules").json()["data"]["groups"]
        return [rule for group in groups for rule in group["rules"]]

    def roll_back(self) -> None:
        """The laptop's page rolls it back to its previous version (once): a ROLLED_BACK state."""
        if not self.rolled_back:
            done = http(self.laptop_page + "/api/rollback", "POST", basic("tech", PASSWORD), b"{}")
            assert done.status == 200 and done.json()["deployment"]["state"] == "ROLLED_BACK", done.body
            self.rolled_back = True


def wait_until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll Prometheus twice a second (it scrapes and evaluates once a second)."""
    return _wait_until(condition, timeout, what, interval=0.5)


def _agent(config: dict[str, Any], tree: Path) -> Agent:
    agent = Agent(AgentConfig.model_validate(config), probe(tree), root=tree)
    agent.start()
    return agent


def _prometheus_config(folder: Path, targets: dict[str, str]) -> Path:
    """The job edge-agent the rules expect, every page of the fleet a target of it; Prometheus
    sends the credentials to each (the pages without credentials ignore them)."""
    (folder / "password").write_text(PASSWORD + "\n")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "edge-agent",
                "basic_auth": {"username": "tech", "password_file": str(folder / "password")},
                "static_configs": [{"targets": sorted(targets.values())}],
            }
        ],
    }
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, bundles: dict[str, Path], keys: dict[str, Path]) -> Iterator[Fleet]:
    binary = shutil.which("prometheus")
    if binary is None:
        missing("prometheus", "prometheus is not installed (Debian: apt-get install prometheus)")
    folder = tmp_path_factory.mktemp("prometheus")
    broker = Broker(folder / "broker").start()
    names = ("laptop-1", "orin-1", *SIMULATED)
    *page_ports, prometheus_port = free_ports(len(names) + 1)
    ports = dict(zip(names, page_ports, strict=True))
    mqtt = {"broker": broker.url, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0}
    laptop_tree = FAKES / "laptop-battery"
    install_versions(folder / "laptop-1", keys, bundles, probe(laptop_tree))
    (folder / "laptop-password").write_text(PASSWORD + "\n")
    laptop = _agent(
        {
            "device": {"id": "laptop-1", "group": "lobby"},
            "state_dir": str(folder / "laptop-1"),
            "trust_keys": [str(keys["public"])],
            "mqtt": mqtt,
            "cameras": [
                {
                    "name": "cam0",
                    "source": "synthetic",
                    "fps": 8,
                    "max_fps": 8,
                    "lines": [{"name": "mid", "points": [[0, 240], [640, 240]]}],
                    "zones": [{"name": "left", "polygon": [[0, 0], [320, 0], [320, 480], [0, 480]]}],
                }
            ],
            "telemetry": {"interval_s": 1.0},
            "status_page": {
                "listen": f"127.0.0.1:{ports['laptop-1']}",
                "username": "tech",
                "password_file": str(folder / "laptop-password"),
            },
        },
        laptop_tree,
    )
    orin_tree = FAKES / "jetson-orin-nano"
    # the orin's last deployment was shadowed and watched on probation (a record built by hand,
    # until the e2e fleet runs a real shadow): the quality panels have its series
    (folder / "orin-1").mkdir()
    (folder / "orin-1" / "deployment.json").write_bytes(JUDGED.to_json())
    orin = _agent(
        {
            "device": {"id": "orin-1", "group": "lobby"},
            "state_dir": str(folder / "orin-1"),
            "mqtt": mqtt,
            "cameras": [],
            "telemetry": {"interval_s": 1.0},
            "status_page": {"listen": f"127.0.0.1:{ports['orin-1']}"},
        },
        orin_tree,
    )
    settings = FleetSettings(broker.url, "sim", (keys["public"],), (keys["operator_pub"],))
    simulated = SimulatedFleet(folder / "sim", SIMULATED, settings, page_ports=ports).start()
    targets = {device: f"127.0.0.1:{port}" for device, port in ports.items()}
    config = _prometheus_config(folder, targets)
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{prometheus_port}", "--storage.tsdb.retention.time=1h"],
        stdout=subprocess.DEVNULL, stderr=(folder / "prometheus.log").open("wb"),
    )  # fmt: skip
    url = f"http://127.0.0.1:{prometheus_port}"
    try:
        wait_until(lambda: _ready(url, process, folder), 60, "prometheus to answer")
        fleet = Fleet(url, laptop, f"http://127.0.0.1:{ports['laptop-1']}", targets)
        wait_until(lambda: _up(fleet) == dict.fromkeys(targets.values(), 1.0), 60, "every target up")
        yield fleet
    finally:
        process.terminate()
        process.wait(30)
        simulated.stop()
        orin.stop()
        laptop.stop()
        broker.stop()


def _ready(url: str, process: subprocess.Popen[bytes], folder: Path) -> bool:
    if process.poll() is not None:
        raise AssertionError(f"prometheus exited: {(folder / 'prometheus.log').read_text()[-2000:]}")
    try:
        return http(url + "/-/ready").status == 200
    except OSError:
        return False


def _up(fleet: Fleet) -> dict[str, float]:
    return {s["metric"]["instance"]: float(s["value"][1]) for s in fleet.query('up{job="edge-agent"}')}


def test_prometheus_scrapes_every_agent_and_knows_each_device(fleet: Fleet) -> None:
    assert _up(fleet) == dict.fromkeys(fleet.targets.values(), 1.0), "every page scraped"
    devices = {s["metric"]["device"]: s["metric"]["instance"] for s in fleet.query("edge_agent_info")}
    assert devices == fleet.targets, "edge_agent_info names the device behind each target"
    fps = fleet.query("edge_agent_camera_fps * on(job, instance) group_left(device) edge_agent_info")
    assert {(s["metric"]["device"], s["metric"]["camera"]) for s in fps} == {("laptop-1", "cam0")}


def test_the_rules_load_and_a_rollback_fires_the_deployment_alert(fleet: Fleet) -> None:
    expected = [r.get("alert") or r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert sorted(rule["name"] for rule in fleet.rules()) == sorted(expected)
    wait_until(lambda: all(r["health"] == "ok" for r in fleet.rules()), 30, "every rule evaluated without error")
    counted = lambda: [float(s["value"][1]) for s in fleet.query("edge_agent:devices_up:count")]  # noqa: E731
    wait_until(lambda: counted() == [len(fleet.targets)], 60, "the recording rule counting every device up")
    deployment_alert = 'ALERTS{alertname="EdgeAgentDeploymentFailed"'
    if not fleet.rolled_back:
        assert fleet.query(deployment_alert + "}") == [], "SUCCEEDED fires nothing"
    fleet.roll_back()
    firing = wait_until(lambda: fleet.query(deployment_alert + ', alertstate="firing"}'), 60, "the alert firing")
    assert [(a["metric"]["instance"], a["metric"]["edge_agent_deployment_state"]) for a in firing] == [
        (fleet.targets["laptop-1"], "ROLLED_BACK")
    ]
    assert fleet.query('ALERTS{alertname=~"EdgeAgentDown|EdgeAgentUnhealthy|EdgeAgentCameraDown"}') == []


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel.get("targets", [])]


def test_every_dashboard_query_returns_series(fleet: Fleet) -> None:
    fleet.roll_back()
    wait_until(lambda: fleet.query('edge_agent_deployment_state{edge_agent_deployment_state="ROLLED_BACK"} == 1'),
               60, "the rollback scraped")  # fmt: skip
    wait_until(lambda: fleet.query("edge_agent:line_crossings:rate5m > 0"), 60, "a line crossing counted")
    variable = json.loads(DASHBOARD.read_text())["templating"]["list"][1]
    assert variable["query"]["query"] == "label_values(edge_agent_info, device)"
    assert set(http(fleet.prometheus + "/api/v1/label/device/values").json()["data"]) == set(fleet.targets)
    queries = dashboard_queries()
    assert len(queries) >= 30
    empty = []
    for title, expr in queries:
        if "$device" not in expr:
            if not fleet.query(expr.replace("$__rate_interval", "1m")):
                empty.append((title, expr))
            continue
        # a panel of one device: series for some device of the fleet, and only of the chosen one
        shown = {}
        for device in fleet.targets:
            series = fleet.query(expr.replace("$device", device).replace("$__rate_interval", "1m"))
            assert {s["metric"].get("device", device) for s in series} <= {device}, f"{title}: {expr}"
            shown[device] = len(series)
        if not any(shown.values()):
            empty.append((title, expr))
    assert empty == [], "dashboard queries without series"
