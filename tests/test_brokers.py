"""The broker as the fleet's engine: its Maximum Packet Size respected, a simulated fleet of the
real device code on one mosquitto, and a site broker bridged to a central one (real mosquitto
processes, the bridge through a TCP relay the test cuts)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from agent.config.models import MqttSection
from agent.mqtt.limits import largest_payload
from agent.mqtt.link import MqttLink
from tests.conftest import REPO
from tests.fleet_helpers import cli
from tests.mqtt_tools import AgentProcess, Broker, TcpProxy, Watcher, agent_config, wait_until

pytestmark = pytest.mark.usefixtures("operator_key")
SMALL = 65536


@pytest.fixture
def small_broker(tmp_path: Path) -> Iterator[Broker]:
    """mosquitto that takes no packet over 64 KiB (and says so in its CONNACK)."""
    broker = Broker(tmp_path / "small", extra=f"max_packet_size {SMALL}\n").start()
    yield broker
    broker.stop()


def test_the_link_reads_the_brokers_maximum_packet_size_and_never_sends_a_larger_packet(small_broker: Broker) -> None:
    link = MqttLink(MqttSection(broker=small_broker.url), "limits-test").start()
    try:
        assert link.wait_connected(10)
        assert link.limits is not None and link.limits.maximum_packet_size == SMALL
        topic = "edge/bundles/" + "0" * 64 + "/0"
        room = largest_payload(SMALL, topic)
        delivery = link.publish(topic, b"x" * room, qos=1)
        assert delivery is not None and delivery.wait(10), "a packet of exactly the maximum size goes through"
        assert link.publish(topic, b"x" * (room + 1), qos=1) is None, "one byte more is not sent"
        assert link.connected and link.reconnects == 0
    finally:
        link.stop()
    connected, cut = threading.Event(), threading.Event()
    raw = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    raw.on_connect = lambda *args: connected.set()
    raw.on_disconnect = lambda *args: cut.set()
    raw.connect("127.0.0.1", small_broker.port)
    raw.loop_start()
    try:
        assert connected.wait(10)
        raw.publish(topic, b"x" * (room + 64), qos=1)  # mosquitto leaves the length's own bytes out of its count
        assert cut.wait(10), "the broker closes a client that sends a larger packet"
    finally:
        raw.loop_stop()


def test_a_push_asking_for_larger_chunks_than_the_broker_takes_still_works(
    tmp_path: Path, capsys, small_broker: Broker, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    config = agent_config(tmp_path, small_broker, "dev1", keys["public"], None, keys["operator_pub"])
    agent = AgentProcess(config).start()
    try:
        status, out = cli(
            capsys,
            *("fleet", "push", str(bundles["v1"]), "--target", "device:dev1", "--broker", small_broker.url),
            *("--chunk-size", "256k", "--wait", "90"),
        )
        assert status == 0 and "dev1: SUCCEEDED" in out, out
        assert "would exceed the broker's maximum packet size (65536 bytes): using 64512-byte chunks" in out, out
        size = bundles["v1"].stat().st_size
        assert f"{-(-size // 64512)} chunks" in out, out
    finally:
        agent.stop()


def test_a_simulated_fleet_of_20_devices_all_succeed() -> None:
    """scripts/fleet_sim.py: 20 agents of the real code, its own mosquitto, one group push."""
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "fleet_sim.py"), "--devices", "20", "--json", "--timeout", "240"],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert (result["devices"], result["succeeded"], result["lost"], result["failed"]) == (20, 20, 0, {}), result
    assert result["throughput_mb_s"] > 0 and result["ceiling_mb_s"] > 0 and result["seconds"] > 0, result
    assert set(result["phases"]) >= {"downloading_s", "verifying_s", "activating_s"}, result


def bridged(folder: Path, central: TcpProxy) -> str:
    """A site broker's bridge to the central one (through `central`, a relay the test can cut):
    everything under edge/ both ways, QoS 1, MQTT 5 (response topics and correlation data cross)."""
    return (
        "connection central\n"
        f"address 127.0.0.1:{central.port}\n"
        "topic edge/# both 1\n"
        "bridge_protocol_version mqttv50\n"
        "cleansession false\n"
        "remote_clientid site-bridge\n"
        "restart_timeout 1\n"
        "keepalive_interval 5\n"
    )


@pytest.fixture
def site(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A central broker (the operator's), a relay to it, and a site broker bridged through the relay."""
    central = Broker(tmp_path / "central").start()
    relay = TcpProxy(central.port).restore()
    local = Broker(tmp_path / "site", extra=bridged(tmp_path, relay)).start()
    yield {"central": central, "relay": relay, "site": local}
    relay.cut()
    local.stop()
    central.stop()


def test_devices_on_a_site_broker_bridged_to_the_central_one(
    tmp_path: Path, capsys, site: dict[str, Any], keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    central, relay, local = site["central"], site["relay"], site["site"]
    agents = [
        AgentProcess(agent_config(tmp_path, local, d, keys["public"], "shop", keys["operator_pub"])).start()
        for d in ("dev1", "dev2")
    ]
    ops = Watcher(central, ["edge/#"])  # the operator's view: the central broker only
    try:
        for device in ("dev1", "dev2"):
            ops.wait_json(f"edge/{device}/status", lambda d: d["state"] == "online", 60)
        operator = ("--broker", central.url)
        status, out = cli(
            capsys, "fleet", "push", str(bundles["v1"]), "--target", "group:shop", *operator, "--wait", "90"
        )
        assert status == 0 and "dev1: SUCCEEDED" in out and "dev2: SUCCEEDED" in out, out

        # the bridge goes down in the middle of the next push, and comes back
        sha = hashlib.sha256(bundles["v2"].read_bytes()).hexdigest()
        at_site = Watcher(local, [f"edge/bundles/{sha}/+"])
        cut_once = threading.Event()

        def cut_at_first_chunk(client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
            if not cut_once.is_set():
                cut_once.set()
                relay.cut()
            Watcher._on_message(at_site, client, userdata, message)

        at_site.client.on_message = cut_at_first_chunk
        status, out = cli(
            capsys, "fleet", "push", str(bundles["v2"]), "--target", "group:shop", *operator, "--chunk-size", "16k"
        )
        assert status == 0, out
        deployment = out.split(" as deployment ")[1].split()[0]
        chunks = -(-bundles["v2"].stat().st_size // 16384)
        wait_until(lambda: at_site.latest, 30, "a first chunk at the site")
        arrived = len(at_site.latest)
        assert arrived < chunks, f"the bridge was cut after {arrived} of {chunks} chunks"
        assert (ops.json("edge/dev1/deployment") or {}).get("id") != deployment, "nothing crossed the cut bridge"
        relay.restore()
        for device in ("dev1", "dev2"):
            record = ops.wait_json(
                f"edge/{device}/deployment", lambda d: d["id"] == deployment and d["state"] == "SUCCEEDED", 120
            )
            assert record["progress"]["chunks_total"] == chunks
        at_site.close()

        status, out = cli(capsys, "fleet", "status", *operator)
        rows = {line.split()[0]: line for line in out.splitlines()[1:]}
        assert all("online" in rows[d] and "1.1.0" in rows[d] for d in ("dev1", "dev2")), out
        status, out = cli(capsys, "fleet", "rollback", "--target", "group:shop", *operator)
        assert status == 0 and out.count("rolled back to demo 1.0.0") == 2, out  # commands and answers cross

        agents[1].kill()  # its last will, published by the site broker, reaches the operator
        ops.wait_json("edge/dev2/status", lambda d: d["state"] == "offline", 30)
    finally:
        ops.close()
        for agent in agents:
            if agent.alive():
                agent.stop()
