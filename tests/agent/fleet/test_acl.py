"""`agent.fleet.acl`: the broker ACL lists each device's own topics; with Home Assistant, over a
real mosquitto, the device's discovery goes through it."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit.broker import Broker, Watcher, secured_broker
from testkit.net import wait_until

from agent.config.models import AgentConfig, MqttSection
from agent.daemon.ha_feed import HomeAssistantFeed
from agent.fleet.acl import mosquitto_acl, parse_devices
from agent.mqtt.home_assistant import Identity, discovery, image_topic
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import Topics

USERS = {"cam-1": "pw-cam-1", "hass": "pw-hass"}


def test_fleet_acl_lists_each_device_s_own_topics() -> None:
    devices = parse_devices(["cam-01:lobby", "# a comment", "", "cam-02  # no group"])
    assert devices == [("cam-01", "lobby"), ("cam-02", None)]
    text = mosquitto_acl(devices, ["ops"], Topics())
    block = text.split("# device cam-01")[1].split("# device")[0]
    assert "topic read edge/groups/lobby/desired" in block and "topic write edge/cam-01/status" in block
    assert "topic write edge/cam-01/report" in block, "the optimisation report (deployments.report)"
    assert "topic write edge/cam-01/deployments" in block, "the deployment reports of the outbox"
    assert "edge/cam-02" not in block and "topic readwrite edge/#" in text.split("# device")[0]
    with pytest.raises(ValueError, match="line 1"):
        parse_devices(["cam 1"])


def test_with_home_assistant_a_device_may_write_its_own_discovery_and_frames_and_read_the_birth() -> None:
    """Issue 37, item 6: the rules for what `agent.daemon.ha_feed` publishes, each device only its own."""
    text = mosquitto_acl([("cam-01", None), ("cam-02", None)], [], Topics(), "ha/disc", ["hass"])
    block = text.split("# device cam-01")[1].split("# device")[0]
    assert "topic write ha/disc/+/cam_01/+/config" in block, "its discovery configs, under its node id (the slug)"
    assert "topic write edge/cam-01/ha/+/image" in block and "topic read ha/disc/status" in block
    assert "cam_02" not in block and "cam-02" not in block
    hass = text.split("user hass")[1].split("# device")[0]
    assert "topic readwrite ha/disc/#" in hass and "topic read edge/+/telemetry" in hass
    assert "topic read edge/+/ha/#" in hass and "topic write" not in hass
    assert "ha/disc" not in mosquitto_acl([("cam-01", None)], [], Topics()), "no rules unless asked for"


def device_link(broker: Broker, folder: Path, device: str) -> MqttLink:
    """`device`'s link, logged in with its password from `USERS` (a password file, as in agent.yaml)."""
    secret = folder / f"{device}.password"
    secret.write_text(USERS[device] + "\n")
    return MqttLink(MqttSection(broker=broker.url, username=device, password={"file": str(secret)}), device)


def home_assistant_feed(folder: Path, link: MqttLink, now: list[float]) -> HomeAssistantFeed:
    """cam-1's Home Assistant feed (one camera with a line and a zone), on the clock `now[0]`."""
    camera = {"name": "cam0", "source": "synthetic", "lines": [{"name": "door", "points": [[0, 0], [9, 9]]}]}
    camera["zones"] = [{"name": "yard", "polygon": [[0, 0], [10, 0], [10, 10]]}]
    config = AgentConfig.model_validate(
        {
            "state_dir": str(folder),
            "mqtt": {"broker": "mqtt://127.0.0.1:1"},
            "cameras": [camera],
            "integrations": {"home_assistant": {"enabled": True}},
        }
    )
    identity = Identity("cam-1", "pi", "1.0")
    return HomeAssistantFeed(config, identity, Topics(), link, lambda name, quality: b"\xff\xd8", lambda: now[0])


def test_the_generated_acl_lets_home_assistant_discovery_through(tmp_path: Path) -> None:
    """Issue 37, item 6: the ACL `fleet acl` wrote denied every discovery config (25 refused
    publishes in 40 s). With ``--home-assistant``, Home Assistant's user receives every config and
    the frame, the device reads Home Assistant's birth, and the broker refuses nothing."""
    acl = mosquitto_acl([("cam-1", None)], ["ops"], Topics(), "homeassistant", ["hass"])
    broker = secured_broker(tmp_path / "broker", USERS, acl)
    hass = Watcher(broker, ["homeassistant/#", "edge/+/ha/#"], "hass", USERS["hass"])
    link = device_link(broker, tmp_path, "cam-1")
    now = [100.0]
    feed = home_assistant_feed(tmp_path, link, now)
    try:
        feed.start()
        link.start()
        assert link.wait_connected(10)
        feed.announce()
        feed.tick()
        configs = [e.topic for e in discovery(feed.identity, Topics(), "homeassistant", feed.cameras)]
        expected = {*configs, image_topic(Topics(), "cam-1", "cam0")}
        assert len(configs) > 10
        wait_until(lambda: expected <= set(hass.latest), 10, "every config and the frame at Home Assistant")
        now[0] += feed.reannounce_s
        hass.client.publish("homeassistant/status", b"online", qos=1)
        count = lambda: sum(1 for m in list(hass.messages) if m.topic == configs[0])  # noqa: E731
        wait_until(lambda: count() == 2, 10, "the configs again on Home Assistant's birth (read through the ACL)")
        assert link.refused() == ()
    finally:
        link.stop()
        hass.close()
        broker.stop()
