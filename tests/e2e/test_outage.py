"""End to end: nothing lost while the broker is down, not even across a SIGKILL (docs/mqtt.md#delivery).

An agent process serves the demo bundle on the tracking scene (objects crossing a counting line)
and publishes through a real mosquitto. The broker is stopped; while it is down the agent keeps
counting and appending more events than the old in-memory queue (here `offline_queue: 5`)
could hold, is killed with SIGKILL, and is started again; then the broker comes back. A
subscriber with a persistent session (so it misses nothing while the broker restarts) receives
every message the outbox numbered: no gap in `seq`, duplicates only under their first `msg_id`,
first arrivals in order; the line totals go on across the kill instead of starting from zero.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from testkit.agent_process import AgentProcess, agent_config
from testkit.broker import Broker, Watcher
from testkit.fleet import finished, online, push, serving
from testkit.net import wait_until

pytestmark = pytest.mark.usefixtures("operator_key")

DEVICE = "dev1"
TOPICS = [f"edge/{DEVICE}/{leaf}" for leaf in ("events", "telemetry", "deployments")]


class SessionSubscriber:
    """An MQTT 5 client with a persistent session (an hour): the broker keeps its subscription and
    queues its QoS 1 messages while it is away, also across a broker restart (persistence)."""

    def __init__(self, broker: Broker) -> None:
        self.messages: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, "outage-subscriber", protocol=MQTTProtocolVersion.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_connect = self._on_connect
        self.client.reconnect_delay_set(0.2, 1.0)
        expiry = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        expiry.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", broker.port, clean_start=False, properties=expiry)
        self.client.loop_start()
        assert self._subscribed.wait(10), "the subscriber could not subscribe"

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if not flags.session_present:
            client.subscribe([(topic, 1) for topic in TOPICS])

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((message.topic, json.loads(message.payload)))

    def received(self) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return list(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def outbox_file(state: Path) -> dict[str, Any]:
    """What the agent's outbox file holds now, read only: events waiting, the last seq, the
    door line's totals."""
    db = sqlite3.connect(f"{(state / 'outbox.sqlite').as_uri()}?mode=ro", uri=True)
    try:
        (events,) = db.execute("SELECT COUNT(*) FROM messages WHERE kind = 'event'").fetchone()
        last = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
        door = db.execute("SELECT a, b, since FROM counts WHERE name = 'line:door'").fetchone()
    finally:
        db.close()
    return {"events": events, "last_seq": last[0] if last else 0, "door": door}


def door_total(telemetry: dict[str, Any]) -> int:
    door = telemetry["analytics"]["lines"]["door"]
    return int(door["in"] + door["out"])


def test_every_event_arrives_after_an_outage_with_a_sigkill_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    broker = Broker(tmp_path / "broker", extra="max_queued_messages 0\nmax_inflight_messages 0\n").start()
    subscriber = SessionSubscriber(broker)
    watcher = Watcher(broker, [f"edge/{DEVICE}/#"])
    camera = {
        "name": "cam0",
        "source": "tracking:5",
        "max_fps": 15,
        "lines": [{"name": "door", "points": [[0, 240], [640, 240]]}],
    }
    config = agent_config(
        tmp_path,
        broker,
        DEVICE,
        keys["public"],
        None,
        keys["operator_pub"],
        cameras=[camera],
        mqtt={"offline_queue": 5},
        events={"min_interval_s": 0.5, "min_confidence": 0.3},
        outbox={"send_rate": 200},
    )
    state = tmp_path / DEVICE / "state"
    agent = AgentProcess(config).start()
    try:
        online(watcher, DEVICE)
        finished(watcher, DEVICE, push(capsys, broker, bundles["v1"], f"device:{DEVICE}"))
        serving(watcher, DEVICE, "1.0.0")
        watcher.close()

        broker.stop()
        before = outbox_file(state)["events"]
        wait_until(lambda: outbox_file(state)["events"] >= before + 12, 120, "events made while the broker is down")
        wait_until(lambda: (outbox_file(state)["door"] or (0, 0))[0] + (outbox_file(state)["door"] or (0, 0))[1] >= 1,
                   120, "a crossing counted while the broker is down")  # fmt: skip
        agent.kill()
        at_kill = outbox_file(state)
        kept_total = at_kill["door"][0] + at_kill["door"][1]

        agent = AgentProcess(config).start()
        wait_until(lambda: outbox_file(state)["last_seq"] > at_kill["last_seq"] + 10, 120, "the restarted agent")
        broker.start()
        wanted = outbox_file(state)["last_seq"]
        wait_until(
            lambda: {m["seq"] for _, m in subscriber.received()} >= set(range(1, wanted + 1)),
            180,
            f"every message numbered 1..{wanted}",
        )
    finally:
        agent.stop()
        subscriber.close()
        broker.stop()

    received = subscriber.received()
    first: dict[int, tuple[str, dict[str, Any]]] = {}
    order = []
    for topic, message in received:
        if message["seq"] in first:
            assert first[message["seq"]][1]["msg_id"] == message["msg_id"], "a duplicate carries the first's id"
        else:
            first[message["seq"]] = (topic, message)
            order.append(message["seq"])
    assert order == sorted(order), "first arrivals come in the device's order"
    assert set(range(1, wanted + 1)) <= set(first), "no gap: every message the outbox numbered arrived"
    events = [m for seq, (topic, m) in first.items() if topic.endswith("/events") and seq <= at_kill["last_seq"]]
    assert len(events) > 5 + before, "more events than the old in-memory queue (offline_queue: 5) held"
    for leaf in ("events", "telemetry", "deployments"):  # a consumer of one topic sees no gap (issue 37)
        numbers = [m["topic_seq"] for _, (topic, m) in sorted(first.items()) if topic.endswith(f"/{leaf}")]
        assert numbers == list(range(1, len(numbers) + 1)), f"{leaf}: its own sequence, through the kill"
    reports = [m for topic, m in first.values() if topic.endswith("/deployments")]
    assert [r["state"] for r in reports][-1] == "SUCCEEDED" and all(r["device"] == DEVICE for r in reports)

    telemetry = [m for seq, (topic, m) in sorted(first.items()) if topic.endswith("/telemetry")]
    booted_before = [t for t in telemetry if t["seq"] <= at_kill["last_seq"]]
    booted_after = [t for t in telemetry if t["seq"] > at_kill["last_seq"]]
    assert booted_before and booted_after
    assert kept_total >= 1
    assert max(door_total(t) for t in booted_before) <= kept_total
    assert door_total(booted_after[0]) >= kept_total, "the line totals go on from the kill, not from zero"
    totals = [door_total(t) for t in telemetry]
    assert totals == sorted(totals), "the totals never go back"
    assert {t["analytics"]["since"] for t in telemetry} == {round(at_kill["door"][2], 3)}, "one since throughout"
    assert all(t["outbox"]["dropped"]["event"] == 0 for t in telemetry)
