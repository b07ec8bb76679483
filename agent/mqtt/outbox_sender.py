"""The ``outbox`` thread: the outbox's messages to the broker, oldest first, at QoS 1.

`OutboxSender` hands the waiting messages (`agent.mqtt.outbox.Outbox.pending`) to the link in
sequence order, at most ``outbox.send_rate`` a second (a token bucket holding ``in_flight``
tokens) and at most ``outbox.in_flight`` awaiting their PUBACK, so a backlog after an outage
leaves the link's other traffic (the retained state documents, command answers, chunks) room in
its window of 20. A message is deleted from the outbox only once its `Delivery` says the broker
acknowledged it. After a reconnect every message not yet acknowledged is sent again from the
oldest (the broker may have had some: duplicates carry the same ``msg_id`` and ``seq``); after a
restart the file still holds them.

A message whose packet the broker's Maximum Packet Size refuses is dropped (counted as
``too_big``), never retried forever; one whose PUBACK is a refusal (mosquitto's 0x87 "Not
authorized": an ACL that denies the topic) was dropped by the broker, and is deleted counted as
``refused``, not as delivered. That is the only failed publish that deletes a message: when
the link could not send it for any other reason (`NotSent`: offline, paho's queue full, its
message ids all in use, ...) it stays, and the sender tries it again after `BUSY_S` (or at the
next PUBACK), in order: nothing after it is sent before it.

Threads: the ``outbox`` thread (a `pipelines.worker.Worker`: a turn that fails is logged and
retried after a backoff) sends and forgets; `wake` may be called from any thread (a new message);
`loop()` tells health how far the thread is past its promised turn, or why it ended.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.config.models import OutboxSection
from agent.mqtt.link import Delivery, MqttLink, NotSent
from agent.mqtt.outbox import Outbox, Pending
from agent.throttle import ThrottledLog
from pipelines.worker import LoopState, Worker

log = logging.getLogger(__name__)

#: how long the thread waits for an acknowledgement before looking again (seconds)
ACK_POLL_S = 0.02
#: the longest wait between two turns (seconds): the thread's heartbeat
IDLE_S = 1.0
#: how long the thread waits when the link could not take a message, nothing of its own in flight
#: (seconds)
BUSY_S = 0.25
#: the sender in `Health`'s words
NAME = "the outbox sender"


class OutboxSender:
    """Sends `outbox` through `link` with `settings` (see the module text)."""

    def __init__(
        self,
        outbox: Outbox,
        link: MqttLink,
        settings: OutboxSection,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.outbox, self.link, self.settings, self._monotonic = outbox, link, settings, monotonic
        self._worker = Worker("outbox", self._step, described=NAME, budget_s=IDLE_S, monotonic=monotonic)
        self._in_flight: dict[int, tuple[Pending, Delivery]] = {}  # seq -> message, its delivery; oldest first
        self._cursor = 0  # the highest seq handed to the link on this connection
        self._connection: int | None = None  # the link's reconnect count when this connection began
        self._tokens = float(settings.in_flight)
        self._refilled = monotonic()
        self._throttled = ThrottledLog(log, clock=monotonic)
        self.sent = 0  # messages handed to the link (a resend counts again)
        self.turns = 0  # turns taken

    def wake(self) -> None:
        """A message was appended (any thread)."""
        self._worker.wake()

    def start(self) -> OutboxSender:
        self._worker.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread; what was acknowledged by then is forgotten, the rest stays on disk."""
        self._worker.stop(timeout)
        self._forget_acked()

    def drain(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds while connected for the outbox to empty (a clean stop);
        True when it did."""
        deadline = time.monotonic() + timeout
        while self.link.connected and self.outbox.stats().messages and time.monotonic() < deadline:
            time.sleep(ACK_POLL_S)
        return not self.outbox.stats().messages

    @property
    def started(self) -> bool:
        """Between `start` and `stop`."""
        return self._worker.started

    def loop(self) -> LoopState:
        """The ``outbox`` thread for health (any thread): past its turn, failing, or ended."""
        return self._worker.state()

    def _step(self) -> float:
        """A turn, then at most `ACK_POLL_S` waiting for the oldest message's PUBACK (it returns
        at the PUBACK); returns the wait before the next turn (seconds)."""
        wait = self.turn()
        oldest = next(iter(self._in_flight.values()), None)
        if wait > 0 and oldest is not None:
            oldest[1].wait(min(wait, ACK_POLL_S))
            return 0.0
        return wait

    def turn(self) -> float:
        """One turn: forget what was acknowledged, send what the rate and the window allow;
        returns how long to wait before the next turn (seconds)."""
        self.turns += 1
        if not self.link.connected:
            self._forget_acked()
            self._in_flight.clear()
            self._connection = None
            return IDLE_S if not self.link.wait_connected(IDLE_S) else 0.0
        if self._connection != self.link.reconnects:  # a new connection: resend from the oldest
            self._forget_acked()
            self._in_flight.clear()
            self._cursor, self._connection = 0, self.link.reconnects
        self._forget_acked()
        self._refill()
        room = min(self.settings.in_flight - len(self._in_flight), int(self._tokens))
        if room <= 0:
            return ACK_POLL_S if self._in_flight else 1.0 / self.settings.send_rate
        batch = self.outbox.pending(self._cursor, room)
        for message in batch:
            delivery = self.link.publish(message.topic, message.payload, qos=1)
            if isinstance(delivery, NotSent) and not delivery.final:
                if not self.link.connected:
                    return 0.0
                self._throttled.warning(
                    "busy", "outbox: message %d waits: the link did not send it (%s)", message.seq, delivery.detail
                )
                return ACK_POLL_S if self._in_flight else BUSY_S  # kept: tried again from it, in order
            if isinstance(delivery, NotSent):
                log.warning("outbox: dropped message %d on %s: the broker would refuse it", message.seq, message.topic)
                self.outbox.discard(message, "too_big")
            else:
                self._in_flight[message.seq] = (message, delivery)
                self.sent += 1
            self._cursor = message.seq
            self._tokens -= 1
        if self._in_flight:
            return ACK_POLL_S
        return 0.0 if len(batch) == room else IDLE_S

    def _refill(self) -> None:
        now = self._monotonic()
        rate = self.settings.send_rate
        self._tokens = min(float(self.settings.in_flight), self._tokens + (now - self._refilled) * rate)
        self._refilled = now

    def _forget_acked(self) -> None:
        """Forget what the broker answered: taken, or refused (dropped by the broker, counted)."""
        done = [(message, delivery.refused) for message, delivery in self._in_flight.values() if delivery.acked]
        if not done:
            return
        self.outbox.acked([message for message, refused in done if refused is None])
        for message, refused in done:
            del self._in_flight[message.seq]
            if refused is not None:
                self._throttled.warning(
                    "refused",
                    "outbox: the broker refused message %d on %s (%s): dropped, counted as refused",
                    message.seq,
                    message.topic,
                    refused,
                )
                self.outbox.discard(message, "refused")
