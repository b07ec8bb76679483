"""`LocalBroker`: the one mosquitto starter, which the demo's simulated fleet runs from the plain
install and testkit's `Broker` builds on (every broker test goes through it as well)."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from testkit.needs import missing
from testkit.net import free_port, wait_until

from agent.fleet import local_broker
from agent.fleet.local_broker import LocalBroker, LocalBrokerError

pytestmark = pytest.mark.daemons  # it starts mosquitto


@pytest.fixture(autouse=True)
def _mosquitto() -> None:
    if local_broker.MOSQUITTO is None:
        missing("mosquitto", "mosquitto is not installed (apt-get install mosquitto)")


def retained(port: int, topic: str) -> bytes | None:
    """The retained message on `topic`, or None when there is none (a sync message tells)."""
    got: list[bytes] = []
    done = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)

    def on_message(client: mqtt.Client, userdata: object, message: mqtt.MQTTMessage) -> None:
        if message.topic == topic:
            got.append(message.payload)
        done.set()

    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.subscribe([(topic, 1), ("sync/+", 1)])
    client.loop_start()
    try:
        client.publish("sync/end", b"", qos=1).wait_for_publish(5)
        assert done.wait(5), "nothing came back"
    finally:
        client.disconnect()
        client.loop_stop()
    return got[0] if got else None


def publish_retained(port: int, topic: str, payload: bytes) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        client.publish(topic, payload, qos=1, retain=True).wait_for_publish(5)
    finally:
        client.disconnect()
        client.loop_stop()


def test_it_serves_on_the_port_given_as_a_fleet_wants_and_writes_nothing(tmp_path: Path) -> None:
    port = free_port()
    broker = LocalBroker(tmp_path / "broker", port).start()
    try:
        assert broker.url == f"mqtt://127.0.0.1:{port}"
        conf = (tmp_path / "broker" / "mosquitto.conf").read_text().splitlines()
        assert f"listener {port} 127.0.0.1" in conf and "allow_anonymous true" in conf
        assert "set_tcp_nodelay true" in conf and "persistence false" in conf
        publish_retained(port, "edge/a/status", b"online")
        assert retained(port, "edge/a/status") == b"online"
    finally:
        broker.stop()
    assert broker.process is not None and broker.process.poll() is not None
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "stopped, nothing listens"
    assert sorted(p.name for p in (tmp_path / "broker").iterdir()) == ["mosquitto.conf", "mosquitto.log"]


def test_without_a_port_the_kernel_picks_a_free_one(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "broker").start()
    try:
        assert broker.port > 0
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", broker.port)) == 0
    finally:
        broker.stop()


def test_with_persistence_what_was_retained_survives_a_kill_and_a_start_on_the_same_port(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "broker", free_port(), persistence=True).start()
    try:
        publish_retained(broker.port, "edge/a/deployment", b"SUCCEEDED")
        saved = tmp_path / "broker" / "mosquitto.db"  # autosaved every second: wait for the save itself
        wait_until(lambda: saved.is_file() and b"SUCCEEDED" in saved.read_bytes(), 10, "the retained message saved")
        broker.kill()
        broker.start()
        assert retained(broker.port, "edge/a/deployment") == b"SUCCEEDED"
    finally:
        broker.stop()


def test_a_broker_that_will_not_start_says_what_mosquitto_said(tmp_path: Path) -> None:
    broker = LocalBroker(tmp_path / "broker", free_port(), extra="no_such_option 1\n")
    with pytest.raises(LocalBrokerError, match=r"mosquitto exited \(\d+\): .*no_such_option"):
        broker.start()


def test_without_mosquitto_it_says_how_to_install_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local_broker, "MOSQUITTO", None)
    with pytest.raises(LocalBrokerError, match="mosquitto is not installed"):
        LocalBroker(tmp_path / "broker", free_port()).start()
