"""End to end over real brokers: a push asking for larger chunks than the broker takes, a simulated
fleet of 20 devices, devices on a site broker bridged to the central one."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit import REPO
from testkit.agent_process import AgentProcess, agent_config
from testkit.broker import Broker, Watcher
from testkit.fleet import cli
from testkit.net import TcpProxy, wait_until

pytestmark = pytest.mark.usefixtures("operator_key")


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


@pytest.mark.long(seconds=20)
def test_a_simulated_fleet_of_20_devices_all_succeed() -> None:
    """bench/fleet_sim.py: 20 agents of the real code, its own mosquitto, one group push."""
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fleet_sim.py"), "--devices", "20", "--json", "--timeout", "240"],
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


def chunk_topics(watcher: Watcher) -> list[str]:
    """The bundle chunks `watcher` has seen (not the index)."""
    return [topic for topic in list(watcher.latest) if not topic.endswith("/index")]


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

        # the bridge goes down in the middle of the next push, and comes back: the relay itself
        # cuts it once half the bundle's bytes crossed toward the site, so the cut cannot race it
        sha = hashlib.sha256(bundles["v2"].read_bytes()).hexdigest()
        at_site = Watcher(local, [f"edge/bundles/{sha}/+"])
        cuts = relay.cuts
        relay.limit(bundles["v2"].stat().st_size // 2, then="cut")
        status, out = cli(
            capsys, "fleet", "push", str(bundles["v2"]), "--target", "group:shop", *operator, "--chunk-size", "16k"
        )
        assert status == 0, out
        deployment = out.split(" as deployment ")[1].split()[0]
        chunks = -(-bundles["v2"].stat().st_size // 16384)
        wait_until(lambda: relay.cuts > cuts, 30, "the relay to cut the bridge")
        wait_until(lambda: chunk_topics(at_site), 30, "a first chunk at the site")
        arrived = len(chunk_topics(at_site))
        assert 0 < arrived < chunks, f"the bridge was cut after {arrived} of {chunks} chunks"
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
