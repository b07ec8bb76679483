"""The desired documents one device follows: its own and its group's, as the gate let them in.

`DesiredDocuments.accept` runs in paho's network thread: it parses a document from the
device's desired topic or its group's, has the `ControlGate` judge it (signed, for this device,
not older than the newest document accepted from the same topic: the one followed.json names or
one accepted since) and keeps it. The deployer's thread reads `wanted()` (a device document
overrides the group's), takes a pending release (`take_release`) and writes the newest issue
times accepted to followed.json (`newest`), so a document replayed after a restart is refused
too, such as a rollout's document from before its halt, and the device's own document in
force (`device_document`), so a restart keeps a pin that the broker lost: an empty retained
message on the device's topic deletes the broker's copy, and with signed control it is refused
(only a signed release or a newer signed document replaces the pin). The stored document is
checked by the gate again at start (a key removed since drops it). `lock` (a condition the
deployer also waits on) guards every field.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace

from agent.bundles.store import Followed
from agent.mqtt.control import ControlGate, ControlRefused, Kind
from agent.mqtt.link import Message
from agent.mqtt.protocol import Desired, ProtocolError, Release, Topics

log = logging.getLogger(__name__)


def latest(*times: float | None) -> float | None:
    """The latest of the issue times given (None when none is)."""
    return max((t for t in times if t is not None), default=None)


class DesiredDocuments:
    """What the device's desired topic and its group's hold, once accepted. `followed` reads
    the deployer's followed record (issue times already written)."""

    def __init__(self, device: str, topics: Topics, gate: ControlGate, followed: Callable[[], Followed]) -> None:
        self.device, self.topics, self.gate, self._followed = device, topics, gate, followed
        self.lock = threading.Condition()
        self.device_doc: Desired | None = None
        self.group_doc: Desired | None = None
        self._released: float | None = None  # issue time of a release not yet recorded
        self.back_to_group = False  # a release came: the group's version is installed even if lower
        self._accepted: dict[Kind, float] = {}  # issue time of the newest document accepted per topic
        self._device_text: str | None = None  # `device_doc` as it arrived, for followed.json
        self._restore()

    def _restore(self) -> None:
        """Take back the device's own document that followed.json kept, if the gate still lets it in."""
        text = self._followed().device_document
        if text is None:
            return
        try:
            document = Desired.parse(text.encode(), "the device document in followed.json")
            self.device_doc = self.gate.accept_document(document, "device", None)
            self._device_text = text
        except (ProtocolError, ControlRefused) as exc:
            log.warning("deployment: the device document kept in followed.json is dropped: %s", exc)

    def kind(self, topic: str) -> Kind:
        return "device" if topic == self.topics.desired(self.device) else "group"

    def wanted(self) -> Desired | None:
        """The document to follow (call under `lock`)."""
        return self.device_doc if self.device_doc is not None else self.group_doc

    def kind_of(self, desired: Desired) -> Kind:
        return "device" if desired is self.device_doc else "group"

    def _read(self, message: Message, kind: Kind) -> Desired | Release | None:
        """The accepted document, None for an empty message (a clear, where unsigned control is
        allowed); `ProtocolError` or `ControlRefused` otherwise."""
        if not message.payload:
            if not self.gate.allow_unsigned:
                raise ControlRefused("an empty message is unsigned: release a device with `edge-agent fleet release`")
            return None
        model: type[Desired] | type[Release] = Release if b'"release"' in message.payload else Desired
        document: Desired | Release = model.parse(message.payload, message.topic)
        if isinstance(document, Release) and kind != "device":
            raise ProtocolError(f"{message.topic}: a release belongs on a device's desired topic")
        followed = self._followed()
        written = followed.device_issued if kind == "device" else followed.group_issued
        with self.lock:
            newest = latest(written, self._accepted.get(kind))
        return self.gate.accept_document(document, kind, newest)

    def accept(self, message: Message) -> None:
        """Keep the document `message` carries (paho's network thread, then the caller notifies
        under `lock`); raises `ProtocolError` or `ControlRefused`, changing nothing."""
        kind = self.kind(message.topic)
        document = self._read(message, kind)
        with self.lock:
            if kind == "device":
                self.device_doc = document if isinstance(document, Desired) else None
                text = bytes(message.payload).decode(errors="replace")
                self._device_text = text if self.device_doc is not None else None
                if isinstance(document, Release):
                    self._released = document.issued_at
                if not isinstance(document, Desired):  # a release, or an empty message where allowed
                    self.back_to_group = True
            else:
                self.group_doc = document if isinstance(document, Desired) else None
            if document is not None and document.signature is not None and document.issued_at is not None:
                self._accepted[kind] = max(document.issued_at, self._accepted.get(kind, 0.0))

    @property
    def release_pending(self) -> bool:
        return self._released is not None

    def take_release(self) -> float | None:
        """The issue time of a release to record, once."""
        with self.lock:
            released, self._released = self._released, None
            return released

    def newest(self, followed: Followed) -> Followed:
        """`followed` with the newest issue times accepted since it was written and the device's
        own document in force now."""
        with self.lock:
            device = latest(followed.device_issued, self._accepted.get("device"))
            group = latest(followed.group_issued, self._accepted.get("group"))
            text = self._device_text
        return replace(followed, device_issued=device, group_issued=group, device_document=text)
