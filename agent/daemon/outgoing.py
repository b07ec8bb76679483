"""What the device sends, in one place: the retained status document straight to the link, and
object and governor events, deployment reports and telemetry through the durable outbox
(`agent.mqtt.outbox`), which the `OutboxSender` delivers once the link is up and forgets at its
PUBACK. Also the page's last `RECENT_EVENTS` events and the events' snapshots and clips kept on
disk (`agent.daemon.media.MediaStore`, `agent.daemon.clips.ClipRecorder`), which the events then
name instead of carrying.

Without a broker (`link` None) nothing is sent; the page's recent events and the media store
still fill.

Threads: `event` runs on the cameras' inference and capture threads (camera health) and the
sampler's, `deployment_report` on the deployer's, `telemetry` on the sampler's, `status`, `media_jpeg`, `media_clip`,
`page_media` and `media_usage` on any. The link, the
outbox and the media store lock themselves; `_reported` is written by the deployer's thread only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import replace

from agent.bundles.record import Deployment
from agent.daemon.clips import ClipRecorder
from agent.daemon.documents import deployment_report_payload, status_payload, telemetry_payload
from agent.daemon.ha_feed import HomeAssistantFeed
from agent.daemon.media import MediaStore
from agent.errors import CodedError, ErrorCode
from agent.event_values import Event, ObjectEvent
from agent.mqtt.link import MqttLink
from agent.mqtt.outbox import Kind, Outbox
from agent.mqtt.outbox_sender import NAME as SENDER
from agent.mqtt.outbox_sender import OutboxSender
from agent.mqtt.protocol import Topics, json_payload
from agent.snapshot import AgentSnapshot, MediaUsage
from pipelines.worker import LoopState

#: how many events the page lists (oldest first, without their crops)
RECENT_EVENTS = 100
#: the outbox sender's thread, as `health()` names it


class Outgoing:
    """`device`'s documents on `topics`; `snapshot` gives the agent now (any thread)."""

    def __init__(
        self,
        device: str,
        topics: Topics,
        outbox: Outbox,
        snapshot: Callable[[], AgentSnapshot],
        link: MqttLink | None = None,
        sender: OutboxSender | None = None,
        media: MediaStore | None = None,
        clips: ClipRecorder | None = None,
        home_assistant: HomeAssistantFeed | None = None,
    ) -> None:
        self.device, self.topics, self.outbox, self.snapshot = device, topics, outbox, snapshot
        self.link, self.sender, self.media, self.clips = link, sender, media, clips
        self.home_assistant = home_assistant  # discovery and camera frames for Home Assistant
        self.recent: deque[Event] = deque(maxlen=RECENT_EVENTS)  # for the page
        self._reported: tuple[str, str, int] | None = None  # the deployment step last reported

    def connected(self) -> None:
        """At each connect (paho's thread): the status, and Home Assistant's discovery."""
        self.status()
        if self.home_assistant is not None:
            self.home_assistant.announce()

    def status(self) -> None:
        """The retained status document, made now."""
        if self.link is not None:
            self.link.publish_state(self.topics.status(self.device), status_payload(self.snapshot()))

    def event(self, event: Event) -> None:
        """An object, governor or camera event: its snapshot into the media store (the event names it),
        the event into the page's recent events, and on the ``events`` topic with the device
        first, through the outbox. On a camera with clips an object's ``start`` opens its clip
        (on the camera's inference thread, right after the frame went into the ring) and its
        events name it."""
        if isinstance(event, ObjectEvent) and self.clips is not None:
            clip = self.clips.trigger(event.camera, event.object_id) if event.kind == "start" else None
            clip = clip or self.clips.planned(event.object_id)
            if clip is not None:
                event = replace(event, clip=clip)
        if isinstance(event, ObjectEvent) and event.snapshot_jpeg is not None and self.media is not None:
            name = self.media.put(event.object_id, event.snapshot_jpeg)
            if name is not None:  # else (the disk refused it) the crop goes in the event as before
                event = replace(event, snapshot_jpeg=None, snapshot=name)
        self.recent.append(event.without_crop())  # the page lists, not crops
        if self.link is not None:
            document = {"device": self.device, **event.to_json()}
            self._send("event", self.topics.events(self.device), json_payload(document))

    def deployment_report(self, deployment: Deployment) -> None:
        """Each new step of a deployment record (its id, state and length of history: a step
        reported once) on ``deployments`` through the outbox; the retained ``deployment``
        document is the deployer's own and stays as it was."""
        step = (deployment.id, deployment.state, len(deployment.history))
        if self.link is None or step == self._reported:
            return
        self._reported = step
        payload = deployment_report_payload(self.device, deployment)
        self._send("deployment", self.topics.deployments(self.device), payload)

    def telemetry(self) -> None:
        """After each sample: telemetry through the outbox, and the status (which keeps the
        retained fps current for ``fleet status``), both from one snapshot; then Home
        Assistant's camera frames when due."""
        if self.link is not None:
            snapshot = self.snapshot()
            self._send("telemetry", self.topics.telemetry(self.device), telemetry_payload(snapshot))
            self.link.publish_state(self.topics.status(self.device), status_payload(snapshot))
        if self.home_assistant is not None:
            self.home_assistant.tick()

    def media_jpeg(self, event_id: str) -> bytes:
        """The ``media`` command: the snapshot kept for an event. Raises `CodedError` ``NO_MEDIA``."""
        jpeg = self.media.get(event_id) if self.media is not None else None
        if jpeg is None:
            raise CodedError(ErrorCode.NO_MEDIA, f"no snapshot of event {event_id} is kept here (gone by retention?)")
        return jpeg

    def media_clip(self, event_id: str) -> bytes:
        """The ``media`` command with ``clip``: the clip kept for an event. Raises ``NO_MEDIA``."""
        found = self.media.clip(event_id) if self.media is not None else None
        if found is None:
            raise CodedError(ErrorCode.NO_MEDIA, f"no clip of event {event_id} is kept here (not yet written, or gone)")
        return found[0]

    def page_media(self, event_id: str, kind: str) -> tuple[bytes, str] | None:
        """The page's ``/api/events/<id>/<kind>``: a kept snapshot or clip and its content type."""
        if self.media is None:
            return None
        if kind == "clip":
            return self.media.clip(event_id)
        jpeg = self.media.get(event_id)
        return None if jpeg is None else (jpeg, "image/jpeg")

    def media_usage(self) -> MediaUsage | None:
        """The media store's use with the clips written and dropped (None: no media store)."""
        if self.media is None:
            return None
        usage, clips = self.media.usage(), self.clips.stats() if self.clips is not None else None
        return usage if clips is None else replace(usage, clips_written=clips.written, clips_dropped=clips.dropped)

    def loop(self) -> LoopState:
        """The outbox sender's thread for `health()` (any thread): how far it is past its turn,
        whether its turns fail, or that it ended (the backlog waits on disk). Without a broker
        there is no sender, and nothing to say."""
        return LoopState(SENDER) if self.sender is None else self.sender.loop()

    def _send(self, kind: Kind, topic: str, payload: bytes) -> None:
        """Into the outbox, which sends it once the link is up and forgets it at its PUBACK; a
        write the disk refuses goes to the link's in-memory queue instead (never raises)."""
        assert self.link is not None
        if self.outbox.append(kind, topic, payload, kept_in_memory=True) is not None:
            if self.sender is not None:
                self.sender.wake()
            return
        self.link.publish_queued(topic, payload, qos=1)
