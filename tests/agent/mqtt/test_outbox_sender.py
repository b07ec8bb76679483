"""`agent.mqtt.outbox_sender` over a real mosquitto: oldest first, deleted only once acknowledged,
everything after a cut (a TCP relay cut under the link while the test's watcher stays connected),
the messages in flight at a cut sent again, the rate bound by an injected clock, a message the
broker would refuse dropped and counted, one its ACL refused counted as dropped, a message paho
would not take (its queue full) kept and sent once it has room."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit.broker import Broker, Watcher, secured_broker
from testkit.net import TcpProxy, wait_until
from testkit.transfer import link_to

from agent.config.models import MqttSection, OutboxSection
from agent.mqtt.link import MqttLink
from agent.mqtt.outbox import Outbox
from agent.mqtt.outbox_sender import OutboxSender

TOPIC = "edge/d/events"


class Ticks:
    """An injected monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def seqs(watcher: Watcher) -> list[int]:
    return [document["seq"] for document in watcher.all_json(TOPIC)]


def test_messages_go_out_oldest_first_and_are_forgotten_once_acknowledged(tmp_path: Path, broker: Broker) -> None:
    watcher = Watcher(broker, [TOPIC])
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    link = link_to(broker.url).start()
    sender = OutboxSender(outbox, link, OutboxSection(send_rate=1000)).start()
    try:
        assert link.wait_connected(10)
        for i in range(60):
            outbox.append("event", TOPIC, b'{"i":%d}' % i)
            sender.wake()
        wait_until(lambda: len(seqs(watcher)) >= 60, 30, "60 messages")
        wait_until(lambda: outbox.stats().messages == 0, 10, "the outbox to forget the acknowledged")
        got = watcher.all_json(TOPIC)
        assert [d["i"] for d in got] == list(range(60)), "in order, each once"
        assert [d["seq"] for d in got] == list(range(1, 61))
        assert len({d["msg_id"] for d in got}) == 60
    finally:
        sender.stop()
        link.stop()
        watcher.close()


def test_after_a_cut_every_message_arrives_in_order_with_duplicates_only_under_their_id(
    tmp_path: Path, broker: Broker
) -> None:
    watcher = Watcher(broker, [TOPIC])
    proxy = TcpProxy(broker.port).restore()
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    link = link_to(proxy.url, keepalive_s=5).start()
    sender = OutboxSender(outbox, link, OutboxSection(send_rate=1000)).start()
    try:
        assert link.wait_connected(10)
        for i in range(20):
            outbox.append("event", TOPIC, b'{"i":%d}' % i)
            sender.wake()
        proxy.cut()
        for i in range(20, 1500):  # more than the old in-memory queue (1000) held
            outbox.append("event", TOPIC, b'{"i":%d}' % i)
            sender.wake()
        wait_until(lambda: not link.connected, 20, "the link to see the cut")
        assert outbox.stats().messages >= 1480, "nothing the broker did not acknowledge is forgotten"
        proxy.restore()
        wait_until(lambda: set(seqs(watcher)) >= set(range(1, 1501)), 120, "every message after the cut")
        wait_until(lambda: outbox.stats().messages == 0, 20, "the outbox to empty")
        got = watcher.all_json(TOPIC)
        first_seen: dict[int, str] = {}
        order: list[int] = []
        for document in got:
            if document["seq"] in first_seen:
                assert first_seen[document["seq"]] == document["msg_id"], "a duplicate carries the same id"
            else:
                first_seen[document["seq"]] = document["msg_id"]
                order.append(document["seq"])
        assert order == sorted(order), "first arrivals in the device's order"
        assert next(d["i"] for d in got if d["seq"] == 1500) == 1499
    finally:
        sender.stop()
        link.stop()
        watcher.close()
        proxy.cut()


def test_the_rate_and_the_window_bound_what_is_handed_to_the_link(tmp_path: Path, broker: Broker) -> None:
    """`turn()` driven by hand with an injected clock: at most `in_flight` tokens at once, then
    `send_rate` per second of the clock; a long idle fills the bucket to `in_flight` tokens, no
    more. The last step catches a planted `_refill` without its `min(in_flight, ...)`: 10 s idle
    then held 500 tokens, and the backlog went out as fast as the PUBACKs came."""
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    for i in range(100):
        outbox.append("telemetry", "edge/d/telemetry", b'{"i":%d}' % i)
    link = link_to(broker.url).start()
    ticks = Ticks()
    sender = OutboxSender(outbox, link, OutboxSection(send_rate=50, in_flight=10), monotonic=ticks)
    try:
        assert link.wait_connected(10)
        for _ in range(5):
            sender.turn()
        assert sender.sent == 10, "a full bucket is in_flight messages"
        wait_until(lambda: (sender.turn(), outbox.stats().messages == 90)[1], 10, "the first ten acknowledged")
        assert sender.sent == 10, "no time passed: no new tokens, even with the window free"
        ticks.now += 0.1  # 50/s for 0.1 s: 5 tokens
        for _ in range(5):
            sender.turn()
        assert sender.sent == 15
        wait_until(lambda: (sender.turn(), outbox.stats().messages == 85)[1], 10, "five more acknowledged")
        ticks.now += 10.0  # the bucket holds in_flight tokens at most
        sender.turn()
        assert sender.sent == 25
        wait_until(lambda: (sender.turn(), outbox.stats().messages <= 75)[1], 10, "those ten acknowledged")
        assert sender.sent == 25, "the idle 10 s left in_flight tokens, all spent: none until the clock moves"
    finally:
        link.stop()


def test_messages_in_flight_at_a_cut_are_sent_again_and_forgotten_once_acknowledged(
    tmp_path: Path, broker: Broker
) -> None:
    """The relay holds back everything toward the link (no PUBACK reaches it) until the sender
    has handed over its window of ten, then cuts the connection: those ten are in flight, none
    acknowledged. The link connects again with a new session (clean start), and the sender sends
    again from the oldest message not acknowledged, so those are acknowledged on the new
    connection and forgotten. Catches a planted reconnect that keeps the cursor: they are then
    never sent again by the sender (paho's own resend is acknowledged, but to a delivery the
    sender no longer holds) and stay in the outbox for good. (The cut test above catches it only
    when a cut finds a message in flight: by chance.)

    It once cut at the first PUBACK instead, and failed under load: that PUBACK could come while
    the sender was still inside its first `publish`, which then answered "not connected" (paho
    had written the packet, then lost the socket), so nothing was in flight and ``sent`` stayed
    0. Now the cut comes only once the window is counted."""
    watcher = Watcher(broker, [TOPIC])
    proxy = TcpProxy(broker.port).restore()
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    link = link_to(proxy.url).start()
    sender = OutboxSender(outbox, link, OutboxSection(send_rate=1000, in_flight=10))
    try:
        assert link.wait_connected(10)
        for i in range(30):
            outbox.append("event", TOPIC, b'{"i":%d}' % i)
        reconnects = link.reconnects
        proxy.limit(0, "hold")  # nothing more reaches the link: no PUBACK
        sender.start()
        wait_until(lambda: sender.sent == 10, 10, "a window of messages handed to the link")
        proxy.cut()  # the PUBACKs held back are lost with the connection
        wait_until(lambda: link.reconnects > reconnects, 10, "the link to see the cut")
        assert sender.sent == 10 and outbox.stats().messages == 30, "ten messages in flight, none acknowledged"
        proxy.restore()
        wait_until(lambda: set(seqs(watcher)) >= set(range(1, 31)), 30, "every message")
        wait_until(lambda: outbox.stats().messages == 0, 10, "the messages in flight at the cut acknowledged")
    finally:
        sender.stop()
        link.stop()
        watcher.close()
        proxy.cut()


@pytest.mark.usefixtures("operator_key")
def test_a_message_the_broker_would_refuse_is_dropped_and_counted(tmp_path: Path, small_broker: Broker) -> None:
    watcher = Watcher(small_broker, [TOPIC])
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    link = link_to(small_broker.url).start()
    sender = OutboxSender(outbox, link, OutboxSection()).start()
    try:
        assert link.wait_connected(10)
        outbox.append("event", TOPIC, json.dumps({"blob": "x" * 70_000}).encode())
        outbox.append("event", TOPIC, b'{"after":1}')
        sender.wake()
        wait_until(lambda: [d.get("after") for d in watcher.all_json(TOPIC)] == [1], 20, "the next message")
        stats = outbox.stats()
        assert (stats.dropped.too_big, stats.dropped.event, stats.messages) == (1, 1, 0)
    finally:
        sender.stop()
        link.stop()
        watcher.close()


def test_a_message_the_broker_refuses_by_its_acl_is_counted_as_dropped_not_delivered(tmp_path: Path) -> None:
    """Issue 37: mosquitto answers a publish its ACL denies with PUBACK 0x87 and drops it. The
    outbox lets the message go (sending it again gets the same answer) but counts it as dropped,
    ``refused``, by kind; what the ACL lets through is delivered and not counted."""
    acl = "user dev1\ntopic write edge/dev1/telemetry\n\nuser watch\ntopic read edge/#\n"
    broker = secured_broker(tmp_path / "broker", {"dev1": "pw-dev1", "watch": "pw-watch"}, acl)
    secret = tmp_path / "dev1.password"
    secret.write_text("pw-dev1\n")
    watcher = Watcher(broker, ["edge/#"], "watch", "pw-watch")
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    link = MqttLink(MqttSection(broker=broker.url, username="dev1", password={"file": str(secret)}), "dev1").start()
    sender = OutboxSender(outbox, link, OutboxSection())
    try:
        assert link.wait_connected(10)
        outbox.append("event", "edge/dev1/events", b'{"i":0}')
        outbox.append("telemetry", "edge/dev1/telemetry", b'{"i":1}')
        outbox.append("event", "edge/dev1/events", b'{"i":2}')
        sender.start()
        wait_until(lambda: outbox.stats().messages == 0, 20, "every message answered by the broker")
        wait_until(lambda: watcher.all_json("edge/dev1/telemetry"), 10, "the permitted telemetry")
        dropped = outbox.stats().dropped
        assert (dropped.refused, dropped.event, dropped.telemetry) == (2, 2, 0), dropped
        assert [(r.topic, r.count) for r in link.refused()] == [("edge/dev1/events", 2)]
        assert watcher.all_json("edge/dev1/events") == [], "the broker did drop them"
    finally:
        sender.stop()
        link.stop()
        watcher.close()
        broker.stop()


def test_a_message_handed_to_the_link_stays_until_its_puback(tmp_path: Path, broker: Broker) -> None:
    """The relay holds back everything toward the link (no PUBACK can come): the messages the
    sender handed over are all still in the outbox; once the relay lets go, they are forgotten."""
    proxy = TcpProxy(broker.port).restore()
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    link = link_to(proxy.url).start()
    sender = OutboxSender(outbox, link, OutboxSection(in_flight=10))
    try:
        assert link.wait_connected(10)
        for i in range(30):
            outbox.append("event", TOPIC, b'{"i":%d}' % i)
        proxy.limit(0, "hold")
        sender.start()
        wait_until(lambda: sender.sent == 10, 10, "a window of messages handed to the link")
        turned = sender.turns
        wait_until(lambda: sender.turns > turned + 5, 10, "the sender to turn a few more times")
        assert sender.sent == 10, "the window is full until the acknowledgements come"
        assert outbox.stats().messages == 30, "none is forgotten before the broker acknowledged it"
        proxy.unlimit()
        wait_until(lambda: outbox.stats().messages == 0, 20, "all acknowledged and forgotten")
    finally:
        sender.stop()
        link.stop()
        proxy.cut()


def test_a_message_paho_does_not_take_stays_in_the_outbox_and_goes_out_once_it_can(
    tmp_path: Path, broker: Broker
) -> None:
    """Issue 37, item 2: a publish that failed for any reason but the broker's size limit (here
    paho's queue full: every slot waits for a PUBACK the relay holds back) once read as "the
    broker would refuse it" and deleted the message as too_big. It stays, and goes out in order
    once the PUBACKs come and the link has room again."""
    watcher = Watcher(broker, [TOPIC])
    proxy = TcpProxy(broker.port).restore()
    settings = MqttSection(broker=proxy.url, reconnect_min_s=0.1, reconnect_max_s=0.3)
    link = MqttLink(settings, "test-link", max_queued=4)
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    sender = OutboxSender(outbox, link, OutboxSection(send_rate=1000))
    try:
        link.start()
        assert link.wait_connected(10)
        proxy.limit(0, "hold")  # no PUBACK reaches the link from now on
        for i in range(4):
            link.publish_state(f"edge/d/filler/{i}", b"x")  # paho's queue holds these four, unacknowledged
        for i in range(3):
            outbox.append("event", TOPIC, b'{"i":%d}' % i)
        for _ in range(3):
            sender.turn()
        stats = outbox.stats()
        assert (stats.dropped.too_big, stats.messages) == (0, 3), "a full queue is no reason to delete a message"
        assert link.connected
        proxy.unlimit()
        sender.start()
        wait_until(lambda: [d["i"] for d in watcher.all_json(TOPIC)] == [0, 1, 2], 20, "the three messages")
        wait_until(lambda: outbox.stats().messages == 0, 10, "the outbox to forget them")
        assert outbox.stats().dropped.too_big == 0
    finally:
        sender.stop()
        link.stop()
        watcher.close()
        proxy.cut()
