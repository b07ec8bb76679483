"""`agent.deployment.desired.DesiredDocuments`: the device's own document in force survives a
reload and a restart; only a signed release hands the device back to its group; a signed
rollout that starts at Infinity is refused (over a real mosquitto without ACL, where anyone may
publish)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from testkit.broker import Broker, Watcher
from testkit.control import unchecked_rollout
from testkit.fleet import cli, finished, online, publish_raw, push, serving
from testkit.net import wait_until

from agent.config.loading import load_config
from agent.daemon.agent import Agent
from agent.hardware.board import probe
from agent.mqtt.protocol import Desired


def write_config(tmp_path: Path, broker: Broker, keys: dict[str, Path]) -> Path:
    config = {
        "device": {"id": "pin-1", "group": "yard"},
        "state_dir": str(tmp_path / "state"),
        "trust_keys": [str(keys["public"])],
        "operator_keys": [str(keys["operator_pub"])],
        "mqtt": {"broker": broker.url, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "cameras": [{"name": "cam0", "source": "synthetic", "max_fps": 10}],
        "deployments": {"autotune": False, "probation_s": 1.0},
        "telemetry": {"interval_s": 0.5},
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def followed_after_the_group(agent: Agent) -> Desired | None:
    """What the deployer follows once the group's retained document arrived (the device's own
    topic is subscribed first, so its retained copy, if the broker has one, came before)."""
    deployer = agent.deployer
    assert deployer is not None
    wait_until(lambda: deployer.documents.group_doc is not None, 30, "the group's retained document")
    with deployer.documents.lock:
        return deployer.wanted()


def test_a_pin_survives_an_unsigned_deletion_a_reload_and_a_restart_until_a_signed_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], broker: Broker, watcher: Watcher, keys, bundles, operator_key
) -> None:
    path = write_config(tmp_path, broker, keys)
    agent = Agent(load_config(path), probe(), config_path=path)
    agent.start()
    try:
        online(watcher, "pin-1")
        finished(watcher, "pin-1", push(capsys, broker, bundles["v2"], "group:yard"))
        pin = push(capsys, broker, bundles["v1"], "device:pin-1", "--allow-downgrade")
        assert finished(watcher, "pin-1", pin)["state"] == "SUCCEEDED"
        serving(watcher, "pin-1", "1.0.0")
        publish_raw(broker, [("edge/pin-1/desired", b"")])  # anyone: the broker drops its retained copy
        assert agent.deployer is not None
        wait_until(lambda: "UNAUTHORIZED" in (agent.deployer.problem or ""), 30, "the empty message refused")
        agent.reload()  # what SIGHUP does: a new deployer subscribes again, the broker has no pin now
        wanted = followed_after_the_group(agent)
        assert wanted is not None and (wanted.id, wanted.version) == (pin, "1.0.0")
    finally:
        agent.stop()
    kept = json.loads((tmp_path / "state" / "followed.json").read_text())
    assert Desired.model_validate_json(kept["device_document"]).id == pin

    agent = Agent(load_config(path), probe(), config_path=path)  # a restart
    agent.start()
    try:
        wanted = followed_after_the_group(agent)
        assert wanted is not None and (wanted.id, wanted.version) == (pin, "1.0.0")
        assert agent.store.info(agent.store.current_sha()).version == "1.0.0"  # type: ignore[union-attr]
        status, out = cli(capsys, "fleet", "release", "--target", "device:pin-1", "--broker", broker.url)
        assert status == 0, out
        serving(watcher, "pin-1", "1.1.0")  # the signed release: back to the group's version
    finally:
        agent.stop()
    assert json.loads((tmp_path / "state" / "followed.json").read_text())["device_document"] is None

    agent = Agent(load_config(path), probe(), config_path=path)
    agent.start()
    try:
        wanted = followed_after_the_group(agent)
        assert wanted is not None and wanted.version == "1.1.0", "released: the group's document is followed"
    finally:
        agent.stop()


def test_a_signed_rollout_that_starts_at_infinity_is_refused_and_the_status_stays_finite(
    tmp_path: Path, broker: Broker, watcher: Watcher, keys, operator: Ed25519PrivateKey
) -> None:
    """It once passed ``ge=0``: the device showed its wave opening at Infinity, `/api/status`
    answered 500 and `fleet status` crashed."""
    path = write_config(tmp_path, broker, keys)
    agent = Agent(load_config(path), probe(), config_path=path)
    agent.start()
    try:
        online(watcher, "pin-1")
        payload = unchecked_rollout(operator, "group:yard", issued_at=round(time.time(), 3), start=math.inf)
        assert b'"start": Infinity' in payload
        publish_raw(broker, [("edge/groups/yard/desired", payload)])
        problem = "rollout.start: Input should be a finite number"
        status = watcher.wait_json("edge/pin-1/status", lambda d: problem in (d.get("deployment_problem") or ""), 30)
        assert status["rollout"] is None
        assert agent.deployer is not None and agent.deployer.documents.group_doc is None
        raw = watcher.latest["edge/pin-1/status"]
        json.loads(raw, parse_constant=lambda name: pytest.fail(f"{name} in the status: {raw!r}"))
    finally:
        agent.stop()
