"""The operator's side as the tests drive it: the fleet CLI in-process, raw MQTT publishes, waiting
for a device's status and deployment, signed command requests, a `Requester` of many commands."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.cli import main
from agent.mqtt.protocol import ChunkIndex, Desired, Topics
from testkit.broker import Broker, Watcher
from testkit.net import wait_until

FINAL = ("SUCCEEDED", "REJECTED", "FAILED", "ROLLED_BACK")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def push(capsys: pytest.CaptureFixture[str], broker: Broker, bundle: Path, target: str, *extra: str) -> str:
    status, out = cli(capsys, "fleet", "push", str(bundle), "--target", target, "--broker", broker.url, *extra)
    assert status == 0, out
    return out.split(" as deployment ")[1].strip()


def online(watcher: Watcher, device: str, timeout: float = 60) -> dict[str, Any]:
    return watcher.wait_json(f"edge/{device}/status", lambda d: d["state"] == "online", timeout)  # type: ignore[no-any-return]


def finished(watcher: Watcher, device: str, deployment_id: str, timeout: float = 90) -> dict[str, Any]:
    return watcher.wait_json(  # type: ignore[no-any-return]
        f"edge/{device}/deployment", lambda d: d["id"] == deployment_id and d["state"] in FINAL, timeout
    )


def serving(watcher: Watcher, device: str, version: str, timeout: float = 60) -> dict[str, Any]:
    """The status names `version` and new telemetry shows frames flowing through it."""
    status = watcher.wait_json(
        f"edge/{device}/status", lambda d: (d.get("bundle") or {}).get("version") == version, timeout
    )
    since = time.time()
    watcher.wait_json(f"edge/{device}/telemetry", lambda d: d["ts"] > since and d["fps"] > 0, timeout)
    return status  # type: ignore[no-any-return]


def publish_raw(broker: Broker, topics: list[tuple[str, bytes]]) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        for topic, payload in topics:
            client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def announce(
    data: bytes, device: str, chunk_size: int, key: Path, sha256: str | None = None, bad_chunk: int | None = None
):
    """The retained messages of a push signed by the operator's `key`, optionally with one
    corrupted chunk or a false sha256."""
    from agent.bundles.signing import load_private_key
    from agent.mqtt.control import sign

    index = ChunkIndex.of(data, chunk_size)
    sha = sha256 or index.sha256
    index = ChunkIndex(sha256=sha, size=index.size, chunk_size=chunk_size, chunks=index.chunks)
    topics = Topics()
    messages = [(topics.index(sha), index.to_bytes())]
    for i in range(len(index.chunks)):
        start, length = index.span(i)
        chunk = data[start : start + length]
        if i == bad_chunk:
            chunk = bytes(length)
        messages.append((topics.chunk(sha, i), chunk))
    desired = Desired(
        id=f"manual-{sha[:8]}-{bad_chunk}",
        name="demo",
        version="9.9.9",
        sha256=sha,
        size=index.size,
        chunk_size=chunk_size,
        chunks=len(index.chunks),
    )
    desired = sign(desired, load_private_key(key), f"device:{device}")
    messages.append((topics.desired(device), desired.to_bytes()))
    return desired.id, messages


def signed_request(key: Path, device: str, name: str, args: dict[str, Any] | None = None, **fields: Any) -> bytes:
    """A command envelope for `device`, signed by the operator's `key`."""
    from agent.bundles.signing import load_private_key
    from agent.mqtt.control import sign
    from agent.mqtt.protocol import CommandRequest

    request = CommandRequest(id=f"t-{time.monotonic_ns()}", command=name, args=args or {})
    return sign(request, load_private_key(key), f"device:{device}", **fields).to_bytes()


def request(
    broker: Broker,
    device: str,
    name: str,
    payload: bytes = b"",
    timeout: float = 30,
    reply_topic: str = "edge/replies/test-42",
) -> tuple[bytes, str]:
    """One MQTT 5 request with a response topic and correlation data; returns (payload, content type)."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    answers: list[mqtt.MQTTMessage] = []
    subscribed = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.on_message = lambda c, u, m: answers.append(m)
    client.on_subscribe = lambda c, u, mid, codes, p: subscribed.set()
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        client.subscribe(reply_topic, qos=1)
        assert subscribed.wait(timeout), f"the broker did not acknowledge the subscription to {reply_topic}"
        properties = Properties(PacketTypes.PUBLISH)
        properties.ResponseTopic = reply_topic
        properties.CorrelationData = b"request-42"
        client.publish(f"edge/{device}/cmd/{name}", payload, qos=1, properties=properties)
        wait_until(lambda: answers, timeout, f"an answer to {name}")
    finally:
        client.disconnect()
        client.loop_stop()
    answer = answers[0]
    assert answer.properties.CorrelationData == b"request-42"
    return bytes(answer.payload), answer.properties.ContentType


class Requester:
    """An operator's MQTT 5 client for `device`: publishes requests with a response topic under
    ``edge/replies/`` and correlation data, and returns the answers (payload, content type).
    Requests from one requester reach the device in the order they were sent (one connection,
    QoS 1)."""

    def __init__(self, broker: Broker, device: str) -> None:
        self.device = device
        self.reply_topic = "edge/replies/test-7"
        self._answers: dict[bytes, tuple[bytes, str]] = {}
        self._arrived = threading.Condition()
        subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        self.client.subscribe(self.reply_topic, qos=1)
        assert subscribed.wait(10), "the requester could not subscribe"
        self._sent = 0

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._arrived:
            self._answers[bytes(message.properties.CorrelationData)] = (
                bytes(message.payload),
                message.properties.ContentType,
            )
            self._arrived.notify_all()

    def send(self, name: str, payload: bytes) -> bytes:
        """Publish a request on ``edge/<device>/cmd/<name>``; its correlation data."""
        return self.send_many(name, [payload])[0]

    def send_many(self, name: str, payloads: list[bytes]) -> list[bytes]:
        """Publish a request on ``edge/<device>/cmd/<name>`` for each of `payloads`, back to back,
        in order (once the broker has the last); their correlation data."""
        correlations, sent = [], []
        for payload in payloads:
            self._sent += 1
            correlation = f"request-{self._sent}".encode()
            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            properties.ResponseTopic = self.reply_topic
            properties.CorrelationData = correlation
            topic = f"edge/{self.device}/cmd/{name}"
            sent.append(self.client.publish(topic, payload, qos=1, properties=properties))
            correlations.append(correlation)
        for info in sent:
            info.wait_for_publish(30)
        return correlations

    def answer(self, correlation: bytes, timeout: float = 20) -> tuple[bytes, str]:
        with self._arrived:
            answered = self._arrived.wait_for(lambda: correlation in self._answers, timeout)
            assert answered, f"no answer to {correlation.decode()} within {timeout:.0f} s"
            return self._answers[correlation]

    def answers(self, correlations: list[bytes]) -> list[tuple[bytes, str]]:
        """The answers that arrived so far to `correlations`."""
        with self._arrived:
            return [self._answers[c] for c in correlations if c in self._answers]

    def answered(self, correlation: bytes, timeout: float) -> bool:
        with self._arrived:
            return self._arrived.wait_for(lambda: correlation in self._answers, timeout)

    def ask(self, name: str, payload: bytes) -> dict[str, Any]:
        body, kind = self.answer(self.send(name, payload))
        assert kind == "application/json"
        return json.loads(body)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
