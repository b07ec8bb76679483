"""The connection to the broker (paho-mqtt 2, MQTT 5), kept alive by an explicit reconnect loop.

`MqttLink.start` runs a supervisor thread: connect, hand the socket to paho's network thread,
wait until the connection is lost, sleep a jittered exponential backoff, connect again. After
every (re)connect the link re-subscribes to every filter it was given and re-publishes the
retained state documents (status, deployment), so the rest of the agent never has to care.

Messages:
- `publish_state`: retained, QoS 1, last value per topic wins; sent now or on the next connect.
- `publish_queued`: while offline a message waits in a bounded queue per topic in memory
  (oldest dropped, `dropped` counts them) and goes out, each topic in order, on the next
  connect. The daemon's events and telemetry go through the durable outbox instead
  (`agent.mqtt.outbox`, sent with `publish` at QoS 1); this queue takes them only when the
  outbox cannot write its file.
- `publish`: sent now or not at all: command requests and responses, chunks, the outbox's
  messages. It returns a `Delivery`, or `NotSent` saying why the message was not sent:
  ``too_big`` (the broker's own refusal, below: sending it again can never work), ``offline``,
  ``queue_full`` (paho holds `max_queued` messages awaiting their PUBACK, or the next message id
  is still in use) or ``failed`` (paho refused it otherwise). Only ``too_big`` is final.

The broker's PUBACK (MQTT 5) says when it refused a QoS 1 message it received: mosquitto
answers a publish its ACL denies with reason code 0x87, "Not authorized", and drops it (with
MQTT 3.1.1 it would drop it without a word). `LinkStats.refused` counts those per topic (at most
`MAX_REFUSED_TOPICS`, the rest under `OTHER_TOPICS`), the log says so at most once per
`ThrottledLog` window, and the page and ``doctor`` show it as a problem
(`agent.web.problems.judge_refused`). A topic leaves the count once a publish on it goes through
(the ACL was fixed and the broker reloaded). The message counts as acknowledged all the same: a
refusal is the broker's answer, sending it again would get the same one; its `Delivery` says it
was `refused` (the outbox counts such a message as dropped, ``refused``).

The broker's CONNACK (MQTT 5) says what it accepts: `limits` holds it as a `BrokerLimits`
(its Maximum Packet Size above all), and a message whose packet would exceed that size is not
sent (the broker would close the connection): `publish` returns `NotSent` ``too_big`` and says
why in the log.

Bounded: paho holds at most `max_queued` QoS 1 messages awaiting their PUBACK (`MAX_QUEUED`,
far below the 65,535 message ids, whose reuse would make paho refuse every publish), at most
`max_inflight` of them sent. What paho does not take waits in the link, one per topic for a
state (the newest) and `offline_queue` per topic for `publish_queued`, and goes out in order
as paho takes it again (the supervisor tries every second while connected).

This is the only module that imports paho: handlers get the link's own `Message`, publishing
returns its own `Delivery` or `NotSent`, so no paho object leaves it.

Liveness: the supervisor turns at least once a second while connected (and announces its
backoff waits), so `LinkStats.stalled_s` grows only when it hangs; while connected it also
checks that paho's network thread still runs, and treats a dead one as a lost connection
(a handler that raised past paho would otherwise leave the link connected in name only).
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from agent.config.models import MqttSection
from agent.errors import ConfigError
from agent.mqtt.limits import BrokerLimits, publish_packet_size
from agent.throttle import ThrottledLog
from pipelines.backoff import Backoff
from pipelines.worker import Worker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Message:
    """One message received: its topic, payload and retain flag, and the MQTT 5 request/response
    properties when the sender set them."""

    topic: str
    payload: bytes
    retain: bool = False
    response_topic: str | None = None
    correlation_data: bytes | None = None
    content_type: str | None = None

    @classmethod
    def from_paho(cls, message: mqtt.MQTTMessage) -> Message:
        properties = getattr(message, "properties", None)
        correlation = getattr(properties, "CorrelationData", None)
        return cls(
            topic=message.topic,
            payload=bytes(message.payload),
            retain=bool(message.retain),
            response_topic=getattr(properties, "ResponseTopic", None),
            correlation_data=bytes(correlation) if correlation is not None else None,
            content_type=getattr(properties, "ContentType", None),
        )


Handler = Callable[[Message], None]
#: the MQTT 5 DISCONNECT reason code a broker sends when another client takes the client id
SESSION_TAKEN_OVER = 142
#: the MQTT 5 PUBACK reason code of a publish the broker's ACL denies
NOT_AUTHORIZED = 135
#: a connection lost sooner than this after it was made, three times in a row, is being taken away
#: (mosquitto closes a taken-over session without saying why)
SHORT_LIVED_S = 5.0
#: the QoS 1 messages paho holds awaiting their PUBACK, at most (its own default is no bound): a
#: device's traffic is a few states, a window of outbox messages and command answers; far below
#: the 65,535 message ids paho has
MAX_QUEUED = 500
#: the topics whose refused publishes are counted one by one, at most (a device publishes on a few
#: dozen); refusals on further topics are counted under `OTHER_TOPICS`
MAX_REFUSED_TOPICS = 64
OTHER_TOPICS = "(other topics)"


class Delivery:
    """A QoS 1 message handed to paho: `acked` once the broker answered it with its PUBACK;
    `refused` then says whether that answer was a refusal (`refusals`: the link's record of
    them, written before paho marks the message acknowledged)."""

    def __init__(self, info: mqtt.MQTTMessageInfo, refusals: Mapping[mqtt.MQTTMessageInfo, str] | None = None) -> None:
        self._info = info
        self._refusals: Mapping[mqtt.MQTTMessageInfo, str] = {} if refusals is None else refusals

    @property
    def acked(self) -> bool:
        return self._info.is_published()

    @property
    def refused(self) -> str | None:
        """The broker's reason when its PUBACK refused the message (an ACL's "Not authorized"):
        it dropped it; None while no PUBACK came, or when it took the message."""
        return self._refusals.get(self._info) if self._info.is_published() else None

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the broker's ack; True once acked."""
        if not self._info.is_published():
            try:
                self._info.wait_for_publish(timeout)
            except (RuntimeError, ValueError):  # the message was dropped (connection lost)
                return False
        return self._info.is_published()


NotSentReason = Literal["offline", "too_big", "queue_full", "failed"]


@dataclass(frozen=True)
class NotSent:
    """What `MqttLink.publish` answers when the message was not sent: `reason` (see the module
    text) and why in words, `detail`. False in a condition, as a failed publish once was None."""

    reason: NotSentReason
    detail: str = ""

    @property
    def final(self) -> bool:
        """The broker refuses this message whenever it is sent (over its Maximum Packet Size):
        the one failure after which a message may be given up."""
        return self.reason == "too_big"

    def __bool__(self) -> bool:
        return False


def _not_sent(rc: MQTTErrorCode) -> NotSent:
    """paho's refusal `rc` of a publish as a `NotSent`."""
    if rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
        return NotSent("queue_full", "paho's queue is full, or its next message id is still in use")
    if rc in (MQTTErrorCode.MQTT_ERR_NO_CONN, MQTTErrorCode.MQTT_ERR_CONN_LOST):
        return NotSent("offline", mqtt.error_string(rc))
    return NotSent("failed", mqtt.error_string(rc))


class Subscribed:
    """A SUBSCRIBE handed to paho: `wait` until the broker's SUBACK says it is in force (after
    which no message published to its filters can be missed)."""

    def __init__(self, acks: _SubAcks, mid: int | None) -> None:
        self._acks, self._mid = acks, mid

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the SUBACK; False when it did not come (or the link
        was offline, so nothing was sent: the subscription starts with the next connection)."""
        return self._mid is not None and self._acks.wait(self._mid, timeout)


class _SubAcks:
    """The message ids of the latest SUBACKs (set in paho's network thread), for `Subscribed`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._mids: deque[int] = deque(maxlen=256)

    def acked(self, mid: int) -> None:
        with self._cond:
            self._mids.append(mid)
            self._cond.notify_all()

    def wait(self, mid: int, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: mid in self._mids, timeout)


def _properties(response_topic: str | None, correlation_data: bytes | None, content_type: str | None) -> Properties:
    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]  # paho's constructor is untyped
    if response_topic is not None:
        properties.ResponseTopic = response_topic
    if correlation_data is not None:
        properties.CorrelationData = correlation_data
    if content_type is not None:
        properties.ContentType = content_type
    return properties


@dataclass(frozen=True)
class Refused:
    """The broker refused `count` QoS 1 publishes on `topic`; `reason` is its PUBACK reason code
    for the latest, in words ("Not authorized": its ACL does not let this client write there)."""

    topic: str
    count: int
    reason: str


@dataclass(frozen=True)
class LinkStats:
    """The link as `stats()` found it: `queued` messages wait for the next connect, `dropped`
    were pushed out of the offline queue, `reconnects` counts lost connections."""

    broker: str
    connected: bool
    reconnects: int
    queued: int
    dropped: int
    last_error: str | None
    stalled_s: float = 0.0  # how long the supervisor is past its announced turn (0: on time)
    refused: tuple[Refused, ...] = ()  # the publishes the broker refused, per topic, most first


@dataclass(frozen=True)
class Will:
    topic: str
    payload: bytes


class MqttLink:
    """One MQTT 5 client with reconnects, re-subscription and an offline queue.

    Handlers run in paho's network thread: they must return quickly (hand work to a queue).
    """

    def __init__(
        self,
        settings: MqttSection,
        client_id: str,
        *,
        will: Will | None = None,
        on_connect: Callable[[], None] = lambda: None,
        backoff: Backoff | None = None,
        max_inflight: int = 20,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self.settings, self.client_id = settings, client_id
        self._on_connect_hook = on_connect
        self._backoff = backoff or Backoff(initial=settings.reconnect_min_s, maximum=settings.reconnect_max_s)
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=MQTTProtocolVersion.MQTTv5,
            reconnect_on_failure=False,  # the supervisor below reconnects, with jitter
        )
        self._client.max_inflight_messages_set(max_inflight)
        self._client.max_queued_messages_set(max_queued)  # 0: no bound (the operator's one-shot tools)
        self._configure(will)
        self._client.on_connect = self._handle_connect
        self._client.on_disconnect = self._handle_disconnect
        self._client.on_message = self._handle_message
        self._subacks = _SubAcks()
        self._client.on_subscribe = lambda client, userdata, mid, codes, properties: self._subacks.acked(mid)
        self._client.on_publish = self._handle_publish
        self._refusals_lock = threading.Lock()  # never held while calling paho (which holds its own)
        self._refusals: dict[str, Refused] = {}  # topic -> the broker's refusals of publishes on it
        self._refused_messages: dict[mqtt.MQTTMessageInfo, str] = {}  # the latest refused, at most MAX_QUEUED
        self._lock = threading.Lock()
        self._throttled = ThrottledLog(log)
        self._handlers: dict[str, tuple[Handler, int, bool]] = {}  # filter -> handler, qos, resubscribe
        self._states: dict[str, bytes] = {}
        self._state_infos: dict[str, Delivery] = {}  # the latest publish of each state
        self._unsent: dict[str, None] = {}  # the states paho has not taken on this connection, in order
        self._queues: dict[str, deque[tuple[bytes, int]]] = {}  # topic -> (payload, qos), oldest first
        self._connected = threading.Event()
        self._attempted = threading.Event()  # the first connection attempt got an answer (or failed)
        self._lost = threading.Event()
        self._worker = Worker("mqtt-link", self._connection, described="the MQTT link's supervisor", budget_s=None)
        self._stop = self._worker.stopping
        self._refused = False  # the broker answered this connection attempt with a failure code
        self._connected_at = 0.0  # when the current connection was accepted (monotonic seconds)
        self._short_lived = 0  # connections in a row lost soon after they were made
        self.dropped = 0  # queued messages pushed out by newer ones while offline
        self.reconnects = 0
        self.last_error: str | None = None
        self.limits: BrokerLimits | None = None  # from the latest CONNACK; None before the first
        self._due = time.monotonic()  # when the supervisor promised to turn again

    def _configure(self, will: Will | None) -> None:
        settings = self.settings
        if settings.username is not None:
            password = settings.password.resolve() if settings.password is not None else None
            self._client.username_pw_set(settings.username, password)
        if settings.uses_tls:
            tls = settings.tls
            try:
                self._client.tls_set(
                    ca_certs=str(tls.ca_file) if tls and tls.ca_file else None,
                    certfile=str(tls.cert_file) if tls and tls.cert_file else None,
                    keyfile=str(tls.key_file) if tls and tls.key_file else None,
                )
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"mqtt.tls: cannot load the certificates or key: {exc}") from exc
        if will is not None:
            self._client.will_set(will.topic, will.payload, qos=1, retain=True)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> MqttLink:
        self._worker.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Disconnect cleanly (no last will) after the queued messages went out."""
        self._stop.set()
        if self._connected.is_set():
            # Wait for the broker's acks first: a socket closed with unread data (a late PUBACK)
            # is reset, and a broker that sees the reset before the DISCONNECT sends the will.
            deadline = time.monotonic() + min(timeout, 2.0)
            for delivery in list(self._state_infos.values()):
                while not delivery.acked and time.monotonic() < deadline and self._connected.is_set():
                    delivery.wait(0.05)
            self._client.disconnect()
            self._lost.wait(timeout)  # paho wrote the DISCONNECT and closed the socket
        self._lost.set()
        self._worker.stop(timeout)
        self._client.loop_stop()

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float | None = None) -> bool:
        return self._connected.wait(timeout)

    def wait_attempted(self, timeout: float | None = None) -> bool:
        """Wait until the first connection attempt succeeded or failed; True once it did."""
        return self._attempted.wait(timeout)

    def stats(self) -> LinkStats:
        """A consistent reading of the link (any thread)."""
        with self._lock:
            queued = sum(len(q) for q in self._queues.values())
            return LinkStats(
                broker=self.settings.broker,
                connected=self.connected,
                reconnects=self.reconnects,
                queued=queued,
                dropped=self.dropped,
                last_error=self.last_error,
                stalled_s=round(max(0.0, time.monotonic() - self._due), 3) if self._worker.started else 0.0,
                refused=self.refused(),
            )

    def refused(self) -> tuple[Refused, ...]:
        """The publishes the broker refused, per topic, the most refused first."""
        with self._refusals_lock:
            return tuple(sorted(self._refusals.values(), key=lambda r: (-r.count, r.topic)))

    def _beat(self, wait_s: float = 0.0) -> None:
        self._due = time.monotonic() + wait_s

    def _network_thread_died(self) -> bool:
        """paho's loop_start thread ended (paho clears `_thread` when it does; it has no public
        accessor, and a paho without that attribute counts as alive)."""
        if not hasattr(self._client, "_thread"):
            return False
        thread = self._client._thread
        return thread is None or not thread.is_alive()

    def _connection(self) -> float:
        """The ``mqtt-link`` worker's turn: one connection, from the attempt until it is lost;
        returns the backoff's wait before the next attempt (seconds)."""
        settings = self.settings
        self._beat()
        self._lost.clear()
        self._refused = False
        try:
            self._client.connect(settings.host, settings.port, settings.keepalive_s, clean_start=True)
        except (OSError, ssl.SSLError) as exc:
            self.last_error = f"cannot connect to {settings.broker}: {exc}"
            log.warning("mqtt: %s", self.last_error)
            self._attempted.set()
            return self._retry()
        sock = self._client.socket()
        if isinstance(sock, socket.socket):
            # small packets (acks, subscribes) go out at once, not after Nagle's delay
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._client.loop_start()
        while not self._lost.wait(1.0):
            self._beat(1.0)
            if self._network_thread_died():
                self.last_error = "paho's network thread ended; reconnecting"
                log.error("mqtt: %s", self.last_error)
                self._lost.set()
            with self._lock:
                self._flush()  # what paho had no room for
        self._client.loop_stop()
        self._connected.clear()
        return self._retry()

    def _retry(self) -> float:
        if self._stop.is_set():
            return 0.0
        delay = self._backoff.next_delay()
        log.info("mqtt: reconnecting to %s in %.1f s", self.settings.broker, delay)
        self._beat(delay)
        return delay

    # -- paho callbacks (network thread) -----------------------------------------------------

    def _handle_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        if reason.is_failure:
            self._refused = True
            self.last_error = f"{self.settings.broker} refused the connection: {reason}"
            log.warning("mqtt: %s", self.last_error)
            self._attempted.set()
            self._lost.set()
            return
        self._connected_at = time.monotonic()
        self.limits = BrokerLimits.from_connack(properties)
        if self.reconnects or self.last_error:
            log.info("mqtt: connected to %s again", self.settings.broker)
        self._backoff.reset()
        with self._lock:
            self._connected.set()
            if self._handlers:
                client.subscribe([(f, qos) for f, (_, qos, _) in self._handlers.items()])
            self._unsent = dict.fromkeys(self._states)
            self._flush()
        self._attempted.set()
        try:
            self._on_connect_hook()
        except Exception:
            log.exception("mqtt: the on-connect hook failed")

    def _handle_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, properties: Any
    ) -> None:
        with self._lock:
            was_connected = self._connected.is_set()
            self._connected.clear()
            self._handlers = {f: h for f, h in self._handlers.items() if h[2]}  # drop the one-connection ones
        self._attempted.set()
        if self._stop.is_set() or self._refused:
            pass  # a clean stop, or a refused CONNACK that already said why
        elif was_connected:
            self.reconnects += 1
            self.last_error = f"connection to {self.settings.broker} lost: {reason}"
            lasted = time.monotonic() - self._connected_at
            self._short_lived = self._short_lived + 1 if lasted < SHORT_LIVED_S else 0
            if getattr(reason, "value", None) == SESSION_TAKEN_OVER or self._short_lived >= 3:
                self.last_error += (
                    f" (the connection keeps being taken away: is another client connected with this client id, "
                    f"{self.client_id}? give each device its own broker credentials and set the broker's "
                    "use_username_as_clientid, docs/security.md)"
                )
            log.warning("mqtt: %s", self.last_error)
        else:
            self.last_error = (
                f"{self.settings.broker} closed the connection before accepting it ({reason}); "
                "check the TLS certificates and the credentials"
            )
            log.warning("mqtt: %s", self.last_error)
        self._lost.set()

    def _handle_publish(
        self, client: mqtt.Client, userdata: Any, mid: int, reason: ReasonCode, properties: Any
    ) -> None:
        """A PUBACK: a failure code is a refusal, counted per topic and logged (throttled)."""
        failed = reason.is_failure
        if not failed and not self._refusals:
            return
        message = getattr(client, "_out_messages", {}).get(mid)
        topic = self._topic_of(message)
        with self._refusals_lock:
            if not failed:
                if topic != OTHER_TOPICS:
                    self._refusals.pop(topic, None)  # a publish on it went through: the ACL lets it now
                return
            info = getattr(message, "info", None)
            if isinstance(info, mqtt.MQTTMessageInfo):
                self._refused_messages[info] = str(reason)  # before paho marks it acknowledged
                while len(self._refused_messages) > MAX_QUEUED:
                    del self._refused_messages[next(iter(self._refused_messages))]
            key = topic if topic in self._refusals or len(self._refusals) < MAX_REFUSED_TOPICS else OTHER_TOPICS
            before = self._refusals.get(key)
            refused = Refused(key, (before.count if before else 0) + 1, str(reason))
            self._refusals[key] = refused
        self._throttled.warning(
            "refused",
            "mqtt: the broker refused a publish on %s (%s; %d so far): %s",
            topic,
            refused.reason,
            refused.count,
            "its ACL does not let this device write there (edge-agent fleet acl, docs/security.md)"
            if getattr(reason, "value", None) == NOT_AUTHORIZED
            else "the message is dropped",
        )

    @staticmethod
    def _topic_of(message: object) -> str:
        """The topic of the QoS 1 message being acknowledged: paho calls `on_publish` with the
        message still in its (private) table, under its own lock; `OTHER_TOPICS` when a paho
        without that table is installed."""
        topic = getattr(message, "topic", None)
        return topic if isinstance(topic, str) else OTHER_TOPICS

    def _handle_message(self, client: mqtt.Client, userdata: Any, raw: mqtt.MQTTMessage) -> None:
        with self._lock:
            handlers = [h for f, (h, _, _) in self._handlers.items() if mqtt.topic_matches_sub(f, raw.topic)]
        message = Message.from_paho(raw)
        for handler in handlers:
            try:
                handler(message)
            except Exception:  # what a message carries may fail a handler each time it comes
                self._throttled.log(
                    logging.ERROR, "handler", "mqtt: handler for %s failed", message.topic, exc_info=True
                )

    # -- subscriptions and publishing (any thread) -------------------------------------------

    def subscribe(self, topic_filter: str, handler: Handler, qos: int = 1, resubscribe: bool = True) -> Subscribed:
        """Route messages on `topic_filter` to `handler`. With `resubscribe` False the
        subscription ends with the connection (`reconnects` tells the caller it ended)."""
        return self.subscribe_many([topic_filter], handler, qos, resubscribe)

    def subscribe_many(
        self, filters: list[str], handler: Handler, qos: int = 1, resubscribe: bool = True
    ) -> Subscribed:
        """Several filters in one SUBSCRIBE packet (retained messages arrive in this order)."""
        mid = None
        with self._lock:
            for topic_filter in filters:
                self._handlers[topic_filter] = (handler, qos, resubscribe)
            if self._connected.is_set() and filters:
                rc, mid = self._client.subscribe([(f, qos) for f in filters])
                mid = mid if rc == MQTTErrorCode.MQTT_ERR_SUCCESS else None
        return Subscribed(self._subacks, mid)

    def unsubscribe(self, topic_filter: str) -> None:
        with self._lock:
            if self._handlers.pop(topic_filter, None) is not None and self._connected.is_set():
                self._client.unsubscribe(topic_filter)

    def publish(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        *,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
        content_type: str | None = None,
    ) -> Delivery | NotSent:
        """Send now, or say why not (`NotSent`; nothing is kept: only ``too_big`` is final, the
        caller may try the others again). `response_topic`, `correlation_data` and
        `content_type` are the MQTT 5 request/response properties."""
        if not self._connected.is_set():
            return NotSent("offline")
        properties = None
        if response_topic is not None or correlation_data is not None or content_type is not None:
            properties = _properties(response_topic, correlation_data, content_type)
        if not self._fits(topic, payload, qos, properties):
            return NotSent("too_big", f"over the broker's maximum packet size ({self._maximum_packet_size()} bytes)")
        info = self._client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            not_sent = _not_sent(info.rc)
            self._throttled.warning(not_sent.reason, "mqtt: not sent to %s: %s", topic, not_sent.detail)
            return not_sent
        return Delivery(info, self._refused_messages)

    def _maximum_packet_size(self) -> int | None:
        return self.limits.maximum_packet_size if self.limits is not None else None

    def _fits(self, topic: str, payload: bytes, qos: int, properties: Properties | None) -> bool:
        """Whether the packet is within the broker's Maximum Packet Size (logged when not)."""
        limits = self.limits
        if limits is None or limits.maximum_packet_size is None:
            return True
        packed = len(properties.pack()) if properties else 1  # type: ignore[no-untyped-call]  # paho is untyped
        size = publish_packet_size(topic, len(payload), qos, packed)
        if limits.fits(size):
            return True
        log.warning(
            "mqtt: not sent to %s: a %d-byte packet, more than the broker's maximum packet size (%d bytes)",
            topic,
            size,
            limits.maximum_packet_size,
        )
        return False

    def reply(self, request: Message, payload: bytes, content_type: str) -> bool:
        """Answer an MQTT 5 request on its response topic with its correlation data (QoS 1);
        False when the request named no response topic or the link is down."""
        if request.response_topic is None:
            return False
        delivery = self.publish(
            request.response_topic,
            payload,
            qos=1,
            correlation_data=request.correlation_data,
            content_type=content_type,
        )
        return isinstance(delivery, Delivery)

    def publish_state(self, topic: str, payload: bytes) -> None:
        """A retained document: the newest per topic is (re)sent whenever the link is up (when
        paho has no room now, as soon as it has: a newer value replaces one still waiting)."""
        with self._lock:
            self._states[topic] = payload
            self._unsent.pop(topic, None)
            self._unsent[topic] = None  # last in the order: sent after the states waiting before it
            self._flush()

    def publish_queued(self, topic: str, payload: bytes, qos: int = 0) -> None:
        """Sent now, or kept in memory until paho takes it (`offline_queue` messages per topic,
        the oldest dropped; each topic in order): what the outbox could not write."""
        with self._lock:
            if self.settings.offline_queue == 0:  # no queue: sent now or not at all
                rc = self._client.publish(topic, payload, qos=qos).rc if self._connected.is_set() else None
                sent = rc == MQTTErrorCode.MQTT_ERR_SUCCESS
                self.dropped += 0 if sent else 1
                return
            queue = self._queues.setdefault(topic, deque(maxlen=self.settings.offline_queue))
            if len(queue) == queue.maxlen:
                self.dropped += 1
            queue.append((payload, qos))
            self._flush()

    def _flush(self) -> None:
        """Hand paho what waits in the link while connected and paho takes it: the states not yet
        sent on this connection, then the queued messages, each topic oldest first. Called with
        `_lock` held (paho's network thread at a connect, the supervisor, the publishers)."""
        if not self._connected.is_set():
            return
        for topic in list(self._unsent):
            info = self._client.publish(topic, self._states[topic], qos=1, retain=True)
            if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                return  # paho is full (or the connection just ended): the next flush tries again
            self._state_infos[topic] = Delivery(info)
            del self._unsent[topic]
        for topic, queue in self._queues.items():
            while queue:
                payload, qos = queue[0]
                if self._client.publish(topic, payload, qos=qos).rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    return
                queue.popleft()
