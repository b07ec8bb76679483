"""The operator's connection to the broker: connect, publish retained documents and wait for
the broker's acks, collect retained state, and MQTT 5 request/response commands."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.config.models import MqttSection
from agent.mqtt.control import sign
from agent.mqtt.link import Delivery, Message, MqttLink, NotSent
from agent.mqtt.protocol import CommandRequest, Topics, written_protocol


class FleetError(Exception):
    """What went wrong talking to the fleet, in words for the operator."""


def connect(settings: MqttSection, timeout: float = 10.0) -> MqttLink:
    """A connected link for one operator command; fails at the first refused attempt."""
    # no bound on paho's queue: a push hands it every chunk at once and waits for each PUBACK
    link = MqttLink(settings, f"edge-agent-fleet-{uuid.uuid4().hex[:8]}", max_inflight=64, max_queued=0).start()
    deadline = time.monotonic() + timeout
    while not link.wait_connected(0.1):
        if link.last_error is not None or time.monotonic() > deadline:
            link.stop()
            raise FleetError(f"cannot reach the broker {settings.broker}: {link.last_error or 'no answer'}")
    return link


def wait_acked(deliveries: list[Delivery], link: MqttLink, timeout: float) -> None:
    """Wait until the broker acknowledged every delivery; `FleetError` if the link drops or
    `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    for delivery in deliveries:
        while not delivery.acked:
            if not link.connected:
                raise FleetError("the broker connection was lost during the push; run it again")
            if time.monotonic() > deadline:
                raise FleetError(f"the broker did not acknowledge the push within {timeout:.0f} s")
            delivery.wait(0.2)


def publish_retained(link: MqttLink, topic: str, payload: bytes, retain: bool = True) -> Delivery:
    """Publish at QoS 1 (retained by default); `FleetError` when it cannot be sent."""
    delivery = link.publish(topic, payload, qos=1, retain=retain)
    if isinstance(delivery, NotSent):
        raise FleetError(_not_sent(delivery, topic, "the push"))
    return delivery


def _not_sent(not_sent: NotSent, topic: str, during: str) -> str:
    """Why a publish on `topic` failed, in the operator's words."""
    if not_sent.reason == "offline":
        return f"the broker connection was lost during {during}; run it again"
    return f"{topic} was not sent: {not_sent.detail}" + ("" if not_sent.final else "; run it again")


@dataclass
class Retained:
    """What a subscription collected: topic -> payload (the retained ones arrive first)."""

    messages: dict[str, bytes] = field(default_factory=dict)
    last: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    keep: Callable[[str], bool] = lambda topic: True

    def add(self, message: Message) -> None:
        payload = message.payload if self.keep(message.topic) or not message.payload else b"."
        with self.lock:
            self.messages[message.topic] = payload
            self.last = time.monotonic()


def collect(
    link: MqttLink, filters: list[str], wait: float, quiet: float = 0.3, keep: Callable[[str], bool] = lambda t: True
) -> dict[str, bytes]:
    """Subscribe to `filters` and gather messages until `quiet` seconds pass without one after the
    broker acknowledged the subscription (at most `wait` seconds in all); empty payloads (cleared
    retained topics) are left out, and the payloads of topics `keep` refuses are not kept (a
    one-byte placeholder: the topic is there). No time to wait (``--listen 0``) collects nothing,
    whatever the broker would have been quick enough to send."""
    if wait <= 0:
        return {}
    retained = Retained(keep=keep)
    start = time.monotonic()
    link.subscribe_many(filters, retained.add).wait(wait)  # the retained messages follow the SUBACK
    retained.last = time.monotonic()
    while time.monotonic() - start < wait and time.monotonic() - retained.last < quiet:
        time.sleep(0.05)
    for topic_filter in filters:
        link.unsubscribe(topic_filter)
    with retained.lock:
        return {t: p for t, p in retained.messages.items() if p}


def command(
    link: MqttLink,
    topics: Topics,
    devices: list[str],
    name: str,
    args: dict[str, Any] | None = None,
    key: Ed25519PrivateKey | None = None,
    timeout: float = 30.0,
) -> dict[str, tuple[bytes, str] | None]:
    """Send command `name` with `args` to each device (MQTT 5 request/response), in a
    `CommandRequest` signed by `key` (unsigned without one: only devices that allow unsigned
    control obey); {device: (answer, content type), or None when it did not answer within
    `timeout` seconds}. Answers come back on a fresh topic in the reply space."""
    reply_topic = topics.reply(uuid.uuid4().hex)
    answers: dict[str, tuple[bytes, str] | None] = dict.fromkeys(devices)
    arrived = threading.Condition()

    def on_answer(message: Message) -> None:
        device = (message.correlation_data or b"").decode(errors="replace")
        with arrived:
            if device in answers:
                answers[device] = (message.payload, message.content_type or "")
                arrived.notify_all()

    subscribed = link.subscribe(reply_topic, on_answer)
    try:
        if not subscribed.wait(timeout):  # an answer sent before the SUBACK could be missed
            raise FleetError(f"the broker did not acknowledge the subscription to {reply_topic}; run it again")
        for device in devices:
            request_id = f"{name}-{uuid.uuid4().hex[:12]}"
            envelope = CommandRequest(
                id=request_id, command=name, args=args or {}, target=f"device:{device}", protocol=written_protocol()
            )
            if key is not None:
                envelope = sign(envelope, key, f"device:{device}")
            request = link.publish(
                topics.command(device, name),
                envelope.to_bytes(),
                qos=1,
                response_topic=reply_topic,
                correlation_data=device.encode(),
            )
            if isinstance(request, NotSent):
                raise FleetError(_not_sent(request, topics.command(device, name), "the command"))
        deadline = time.monotonic() + timeout
        with arrived:
            while any(v is None for v in answers.values()) and time.monotonic() < deadline:
                arrived.wait(0.2)
    finally:
        link.unsubscribe(reply_topic)
    return answers


#: the device's ``media`` rate limit is 8 a second with a burst of 16: a clip's chunks are asked
#: for at most this often after the first `CLIP_BURST`, so none is dropped unanswered
CLIP_PACE_S = 1 / 7
CLIP_BURST = 12
#: the most bytes a chunked answer may announce (a clip, the samples' archive: the device caps 64 MiB)
CHUNKED_MAX_BYTES = 256 * 1024 * 1024


def fetch_clip(
    link: MqttLink,
    topics: Topics,
    device: str,
    event: str,
    key: Ed25519PrivateKey | None = None,
    timeout: float = 30.0,
    chunk_size: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> bytes:
    """The clip `device` kept for object event `event`, over MQTT in chunks: the ``media``
    command with ``clip`` answers its size, chunk count and sha256, then each ``chunk`` its
    bytes; the whole is checked against the sha256. Raises `FleetError` naming what failed (no
    answer within `timeout` seconds, the device's error, a chunk of the wrong size, a wrong hash).
    `chunk_size` (bytes, 1 KiB .. 1 MiB) asks for chunks of that size (None: the device's 96 KiB)."""
    args = {"event": event, "clip": True}
    clip, _ = fetch_chunked(
        link, topics, device, "media", args, "video/mp4", "the clip", key, timeout, chunk_size, sleep
    )
    return clip


def fetch_chunked(
    link: MqttLink,
    topics: Topics,
    device: str,
    name: str,
    args: dict[str, Any],
    content_type: str,
    what: str,
    key: Ed25519PrivateKey | None = None,
    timeout: float = 30.0,
    chunk_size: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    max_size: int = CHUNKED_MAX_BYTES,
    keep: tuple[str, ...] = (),
) -> tuple[bytes, dict[str, Any]]:
    """What command `name` with `args` answers in chunks (a clip, the samples' archive): the
    first answer gives the size, chunk count and sha256 (and what else the command says, returned
    with the bytes), then each ``chunk`` its bytes of `content_type`, asked for in turn paced under
    the device's rate limit, with the first answer's `keep` keys added to `args` (the samples'
    ``until``: every chunk is cut from the same archive); the whole is checked against the sha256.
    The announced size must be at most `max_size`. Raises `FleetError` naming what failed."""
    import hashlib
    import json

    def ask(extra: dict[str, Any]) -> tuple[bytes, str]:
        answer = command(link, topics, [device], name, {**args, **extra}, key, timeout)[device]
        if answer is None:
            raise FleetError(f"{device} did not answer within {timeout:.0f} s (offline?)")
        body, answered_type = answer
        if answered_type == content_type:
            return body, answered_type
        try:
            document = json.loads(body)
        except ValueError as exc:
            raise FleetError(f"{device} answered {answered_type or 'bytes'} that are neither {what} nor JSON") from exc
        if not document.get("ok"):
            raise FleetError(f"{device}: {document['error']['code']}: {document['error']['message']}")
        return body, answered_type

    body, _ = ask({} if chunk_size is None else {"chunk_size": chunk_size})
    info = dict(json.loads(body)["result"])
    size, chunk_size, chunks = int(info["size"]), int(info["chunk_size"]), int(info["chunks"])
    if size > max_size:
        raise FleetError(f"{device}: {what} is {size} bytes, over the {max_size} this client takes")
    follow = {name_: info[name_] for name_ in keep if name_ in info}
    parts = []
    for i in range(chunks):
        if i >= CLIP_BURST:
            sleep(CLIP_PACE_S)  # pacing for the device's rate limit, not a wait for an event
        data, answered_type = ask({**follow, "chunk": i, "chunk_size": chunk_size})
        expected = min(chunk_size, size - i * chunk_size)
        if answered_type != content_type or len(data) != expected:
            raise FleetError(f"{device}: chunk {i} of {what} has {len(data)} bytes, expected {expected}")
        parts.append(data)
    whole = b"".join(parts)
    if hashlib.sha256(whole).hexdigest() != info["sha256"]:
        raise FleetError(f"{device}: {what}'s sha256 does not match what the device announced; run it again")
    return whole, info
