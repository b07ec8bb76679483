"""`agent.fleet.acl`: the broker ACL lists each device's own topics."""

from __future__ import annotations

import pytest

from agent.fleet.acl import mosquitto_acl, parse_devices
from agent.mqtt.protocol import Topics


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
