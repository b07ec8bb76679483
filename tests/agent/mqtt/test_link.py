"""`agent.mqtt.link` against a real mosquitto: the broker's maximum packet size, the offline queues, TLS
with a client certificate and a password, a reconnect after paho's network thread dies, paho's
bounded queue and what waits in the link while it is full."""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from testkit.broker import SMALL_PACKET, Broker, Watcher, secured_broker
from testkit.net import TcpProxy, wait_until
from testkit.tls import secured_listener
from testkit.transfer import link_to

from agent.config.models import MqttSection
from agent.mqtt import link as link_module
from agent.mqtt.limits import largest_payload
from agent.mqtt.link import OTHER_TOPICS, Delivery, Message, MqttLink, NotSent

pytestmark = pytest.mark.usefixtures("operator_key")


def test_the_link_reads_the_brokers_maximum_packet_size_and_never_sends_a_larger_packet(small_broker: Broker) -> None:
    link = MqttLink(MqttSection(broker=small_broker.url), "limits-test").start()
    try:
        assert link.wait_connected(10)
        assert link.limits is not None and link.limits.maximum_packet_size == SMALL_PACKET
        topic = "edge/bundles/" + "0" * 64 + "/0"
        room = largest_payload(SMALL_PACKET, topic)
        delivery = link.publish(topic, b"x" * room, qos=1)
        assert isinstance(delivery, Delivery) and delivery.wait(10), "a packet of exactly the maximum size goes through"
        refused = link.publish(topic, b"x" * (room + 1), qos=1)
        assert isinstance(refused, NotSent) and refused.final, "one byte more is not sent, ever"
        assert refused.reason == "too_big" and str(SMALL_PACKET) in refused.detail
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


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread that dies
def test_the_link_reconnects_when_paho_network_thread_dies(broker: Broker) -> None:
    """A handler that raises past paho ends paho's network thread; the link's supervisor sees it
    and connects again, instead of staying connected in name only."""
    link = MqttLink(MqttSection(broker=broker.url, reconnect_min_s=0.1, reconnect_max_s=0.5), "link-test")
    got: list[str] = []

    def handler(message: Message) -> None:
        if message.payload == b"die":
            raise SystemExit("a handler bug that is not an Exception")
        got.append(message.payload.decode())

    link.subscribe("t/#", handler)
    link.start()
    try:
        assert link.wait_attempted(10) and link.wait_connected(10)
        assert link.stats().stalled_s < 2.0
        link.publish("t/x", b"die", qos=0)
        wait_until(lambda: link.last_error and "network thread" in link.last_error, 15, "the dead thread noticed")
        wait_until(lambda: link.connected, 15, "the link connected again")
        wait_until(lambda: link.publish("t/x", b"alive", qos=1) and "alive" in got, 15, "a message after it")
    finally:
        link.stop()


def test_a_subscription_is_in_force_once_its_suback_came(broker: Broker) -> None:
    """`Subscribed.wait` is true only after the broker's SUBACK: with everything toward the
    client held back it cannot be, and once released the retained message follows it. Offline,
    nothing was sent, so there is nothing to wait for."""
    offline = MqttLink(MqttSection(broker=broker.url), "link-offline")
    assert offline.subscribe("t/#", lambda m: None).wait(0) is False
    proxy = TcpProxy(broker.port).restore()
    link = link_to(proxy.url)
    got: list[bytes] = []
    publisher = MqttLink(MqttSection(broker=broker.url), "link-publisher")  # a client id of its own
    publisher.start()
    link.start()
    try:
        assert publisher.wait_connected(10) and link.wait_connected(10)
        delivery = publisher.publish("t/retained", b"kept", qos=1, retain=True)
        assert isinstance(delivery, Delivery) and delivery.wait(10)
        proxy.limit(0, then="hold")
        subscribed = link.subscribe("t/#", lambda m: got.append(m.payload))
        assert subscribed.wait(0.2) is False, "no SUBACK can have come: the proxy holds it"
        proxy.unlimit()
        assert subscribed.wait(10)
        wait_until(lambda: got == [b"kept"], 10, "the retained message after the SUBACK")
    finally:
        link.stop()
        publisher.stop()


def test_what_paho_has_no_room_for_waits_in_the_link_and_goes_out_in_order(broker: Broker) -> None:
    """paho holds at most `max_queued` messages awaiting their PUBACK (issue 37, item 2: without a
    bound a flood queued more than its 65,535 message ids and every publish failed). Past it
    `publish` says ``queue_full``, which is not final; the states and queued messages wait in the
    link (the newest state per topic, the queued ones in order) until the PUBACKs come."""
    watcher = Watcher(broker, ["edge/q/#"])
    proxy = TcpProxy(broker.port).restore()
    link = MqttLink(MqttSection(broker=proxy.url, reconnect_min_s=0.1, reconnect_max_s=0.3), "link-full", max_queued=2)
    try:
        link.start()
        assert link.wait_connected(10)
        proxy.limit(0, "hold")  # no PUBACK reaches the link from now on
        assert isinstance(link.publish("edge/q/first", b"1", qos=1), Delivery)
        link.publish_state("edge/q/state", b"s1")  # the second and last slot
        refused = link.publish("edge/q/second", b"2", qos=1)
        assert isinstance(refused, NotSent) and refused.reason == "queue_full" and not refused.final
        for i in range(3):
            link.publish_queued("edge/q/queued", str(i).encode(), qos=1)
        link.publish_state("edge/q/state", b"s2")
        link.publish_state("edge/q/state", b"s3")
        assert link.stats().queued == 3 and link.connected
        proxy.unlimit()

        def arrived() -> bool:
            queued = [m.payload for m in list(watcher.messages) if m.topic == "edge/q/queued"]
            return watcher.latest.get("edge/q/state") == b"s3" and queued == [b"0", b"1", b"2"]

        wait_until(arrived, 10, "the state's newest value and the queued messages in order")
        states = [m.payload for m in list(watcher.messages) if m.topic == "edge/q/state"]
        assert states == [b"s1", b"s3"], "a newer value replaced the one that waited"
        assert link.stats().queued == 0 and "edge/q/second" not in watcher.latest
    finally:
        link.stop()
        watcher.close()
        proxy.cut()


def test_offline_queue_keeps_the_newest_messages_per_topic_and_counts_the_dropped(broker: Broker) -> None:
    link = link_to(broker.url, offline_queue=3)
    for i in range(5):
        link.publish_queued("edge/q/telemetry", str(i).encode())
    for i in range(10):
        link.publish_queued("edge/q/events", f"e{i}".encode())  # a burst of events
    link.publish_state("edge/q/status", b"online")
    assert link.dropped == 2 + 7 and link.stats().queued == 6
    watcher = Watcher(broker, ["edge/q/#"])
    try:
        link.start()
        wait_until(lambda: len(watcher.messages) == 7, 10, "the queued messages")
        assert [m.payload for m in watcher.messages if m.topic.endswith("telemetry")] == [b"2", b"3", b"4"]
        assert [m.payload for m in watcher.messages if m.topic.endswith("events")] == [b"e7", b"e8", b"e9"]
        assert watcher.latest["edge/q/status"] == b"online"
    finally:
        link.stop()
        watcher.close()


def test_link_stats_read_the_offline_queues_under_the_lock() -> None:
    """stats() runs in the telemetry thread while events are queued from camera threads: it
    must read the queues under the link's lock (a topic added mid-read is a torn count, or a
    'dictionary changed size during iteration')."""
    link = link_to("mqtt://127.0.0.1:1")  # never started: every message waits in the queues
    link.publish_queued("edge/d/telemetry", b"1")
    writer_waited = []

    class WatchedQueues(dict):  # the link's own queues, noticing a write while stats() reads them
        def values(self):  # type: ignore[override]
            if not writer_waited:  # the first read only
                writer = threading.Thread(target=link.publish_queued, args=("edge/d/events", b"2"))
                writer.start()
                writer.join(0.3)
                writer_waited.append(writer.is_alive())
            return super().values()

    link._queues = WatchedQueues(link._queues)
    assert link.stats().queued == 1
    assert writer_waited == [True], "a camera thread changed the queues while stats() read them"
    wait_until(lambda: link.stats().queued == 2, 5, "the waiting write")


def test_tls_with_client_certificate_and_password(tmp_path: Path, capsys) -> None:
    from agent.cli import main

    certs, listener = secured_listener(tmp_path, client_certificate=True)
    broker = Broker(tmp_path / "broker", listener=listener)
    (tmp_path / "pw").write_text("s3cret\n")
    tls = {"ca_file": certs["ca.pem"], "cert_file": certs["device.pem"], "key_file": certs["device.key"]}
    url = f"mqtts://127.0.0.1:{broker.port}"
    broker.start()
    try:
        good = link_to(url, username="cam-1", password={"file": tmp_path / "pw"}, tls=tls).start()
        assert good.wait_connected(10), good.last_error
        good.publish_state("edge/cam-1/status", b'{"state": "online"}')
        good.stop()  # waits for the broker's ack of the retained state

        wrong = link_to(url, username="cam-1", password={"value": "nope"}, tls=tls).start()
        wait_until(lambda: wrong.last_error, 10, "the refusal")
        assert not wrong.connected and "refused" in (wrong.last_error or "")
        wrong.stop()
        no_cert = link_to(url, username="cam-1", password={"value": "s3cret"}, tls={"ca_file": certs["ca.pem"]})
        no_cert.start()
        wait_until(lambda: no_cert.last_error, 10, "the TLS failure")
        assert not no_cert.connected
        # TLS 1.3 refuses the missing certificate after the handshake (the broker closes before its
        # CONNACK); older TLS fails the handshake itself: either way the reason names the certificate
        assert "certificate" in (no_cert.last_error or ""), no_cert.last_error
        no_cert.stop()

        args = ["fleet", "status", "--json", "--broker", url, "--username", "cam-1", "--password-file"]
        args += [str(tmp_path / "pw"), "--ca-file", str(certs["ca.pem"]), "--cert-file", str(certs["device.pem"])]
        assert main([*args, "--key-file", str(certs["device.key"])]) == 0
        assert json.loads(capsys.readouterr().out)["cam-1"]["status"] == {"state": "online"}
    finally:
        broker.stop()


def test_publishes_the_broker_refuses_are_counted_per_topic_until_one_goes_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37, item 6: mosquitto answers a QoS 1 publish its ACL denies with PUBACK 0x87 and
    drops it; the link counts them per topic (a bounded map: past `MAX_REFUSED_TOPICS` under one
    key), and a topic leaves the count once a publish on it goes through (the ACL fixed, the
    broker reloaded)."""
    monkeypatch.setattr(link_module, "MAX_REFUSED_TOPICS", 2)
    caplog.set_level(logging.WARNING, logger="agent.mqtt.link")  # `doctor` quiets agent.mqtt in this process
    acl = "user dev1\ntopic write edge/dev1/status\n"
    broker = secured_broker(tmp_path / "broker", {"dev1": "pw-dev1"}, acl)
    secret = tmp_path / "dev1.password"
    secret.write_text("pw-dev1\n")
    link = MqttLink(MqttSection(broker=broker.url, username="dev1", password={"file": str(secret)}), "dev1").start()

    def send(topic: str) -> str | None:
        delivery = link.publish(topic, b"{}", qos=1)
        assert isinstance(delivery, Delivery) and delivery.wait(10), f"no PUBACK for {topic}"
        return delivery.refused

    try:
        assert link.wait_connected(10)
        for topic in ["homeassistant/sensor/dev1/fps/config"] * 3 + ["edge/dev1/ha/cam0/image"]:
            assert send(topic) == "Not authorized", "the delivery says the broker refused it"
        assert send("edge/dev1/status") is None, "taken"
        refused = [(r.topic, r.count, r.reason) for r in link.stats().refused]
        assert refused == [
            ("homeassistant/sensor/dev1/fps/config", 3, "Not authorized"),
            ("edge/dev1/ha/cam0/image", 1, "Not authorized"),
        ], "the permitted status is not counted"
        send("homeassistant/sensor/dev1/temperature/config")
        send("edge/other")
        lines = [r.getMessage() for r in caplog.records if "refused a publish" in r.getMessage()]
        assert len(lines) == 1 and "fleet acl" in lines[0], "logged once per window, however many (an outsider's)"
        counts = {r.topic: r.count for r in link.refused()}
        assert len(counts) == 3 and counts[OTHER_TOPICS] == 2, "bounded: the topics past the bound counted in one"

        (tmp_path / "broker" / "edge-agent.acl").write_text(acl + "topic write homeassistant/#\n")
        assert broker.process is not None
        broker.process.send_signal(signal.SIGHUP)  # mosquitto reads its ACL file again
        wait_until(
            lambda: not send("homeassistant/sensor/dev1/fps/config") and "fps" not in str(link.refused()),
            10,
            "the topic's count gone once a publish on it went through",
        )
        assert [r.topic for r in link.refused()] == [OTHER_TOPICS, "edge/dev1/ha/cam0/image"], "most refused first"
    finally:
        link.stop()
        broker.stop()
