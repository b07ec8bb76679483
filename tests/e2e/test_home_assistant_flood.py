"""End to end, no Home Assistant needed: a flood of Home Assistant births (``online`` on
``homeassistant/status``, which anyone on the broker may publish) against an agent with
``integrations.home_assistant`` enabled. Issue 37, item 2: each birth re-published every
discovery config at once, unpaced; 2,000 births sent 25 MB and delayed a signed ping 13 s, and
past 65,535 queued messages paho's message ids collided and the outbox deleted 55 events and
summaries as ``too_big``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from testkit.agent_process import AgentProcess
from testkit.broker import Broker, Watcher
from testkit.fleet import Requester, signed_request
from testkit.net import wait_until

pytestmark = pytest.mark.usefixtures("operator_key")

DEVICE = "dev1"
#: births in all, in batches, a signed ping after each batch
FLOOD, BATCH = 4000, 500
#: the longest a ping may wait for its answer during the flood (seconds)
PROMPT_S = 5.0


def _configs(watcher: Watcher) -> list[str]:
    """The topics of the discovery configs published so far, one per publish."""
    return [m.topic for m in list(watcher.messages) if m.topic.endswith("/config") and m.payload]


def test_a_flood_of_births_leaves_pings_answered_the_configs_paced_and_the_outbox_whole(
    broker: Broker, watcher: Watcher, agents: Callable[..., AgentProcess], operator_key: Path
) -> None:
    agent = agents(DEVICE, integrations={"home_assistant": {"enabled": True}})
    configs = Watcher(broker, ["homeassistant/#"])
    requester = Requester(broker, DEVICE)
    flooder = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    flooder.max_inflight_messages_set(0)  # every birth of a batch at the broker at once
    flooder.connect("127.0.0.1", broker.port)
    flooder.loop_start()

    def ping() -> float:
        """A signed ping's round trip (seconds); fails past `PROMPT_S`."""
        started = time.monotonic()
        body, _ = requester.answer(requester.send("ping", signed_request(operator_key, DEVICE, "ping")), PROMPT_S)
        assert json.loads(body)["ok"] is True, body
        return time.monotonic() - started

    try:
        wait_until(lambda: _configs(configs), 60, "the discovery configs of the agent's connect")
        ping()  # the agent answers: its connect's announcement was published before
        configs.sync("homeassistant/test-sync")
        before = len(_configs(configs))
        entities = len(set(_configs(configs)))
        waits = []
        for _ in range(FLOOD // BATCH):
            infos = [flooder.publish("homeassistant/status", b"online", qos=1) for _ in range(BATCH)]
            infos[-1].wait_for_publish(60)  # the broker holds the batch: the ping comes behind it
            waits.append(ping())
        ping()  # behind the whole flood
        configs.sync("homeassistant/test-sync")
        published = len(_configs(configs)) - before
        # at once for a birth more than an interval after the last announcement, and once more at
        # the interval's end (30 s) for all the births within it; the flood asked for FLOOD of them
        assert published <= 3 * entities, f"{published} configs published for {FLOOD} births ({entities} entities)"
        flooded = time.time()
        telemetry = watcher.wait_json(f"edge/{DEVICE}/telemetry", lambda t: t["ts"] > flooded, 30)
        dropped = telemetry["outbox"]["dropped"]
        assert not any(dropped.values()), f"the outbox dropped messages: {dropped}"
        assert max(waits) < PROMPT_S, waits
    finally:
        flooder.disconnect()
        flooder.loop_stop()
        requester.close()
        configs.close()
    assert agent.alive() and "Traceback" not in agent.output()
    held = [line for line in agent.output().splitlines() if "held back" in line]
    assert 1 <= len(held) <= 4, held
