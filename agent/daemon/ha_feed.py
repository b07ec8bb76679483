"""Home Assistant discovery on the device (``integrations.home_assistant``, docs/integrations.md).

`HomeAssistantFeed` publishes the retained discovery configs of `agent.mqtt.home_assistant` when
the link connects and again when Home Assistant announces itself (``<prefix>/status`` =
``online``, its birth message after a restart), and each camera's annotated frame at most every
``image_interval_s`` on its image topic. The config topics it published are kept in
``<state_dir>/home_assistant.json``: an entity that is no longer in the config (a camera, line
or zone removed, then SIGHUP or a restart) gets an empty retained config, which makes Home
Assistant remove it.

Births are paced: anyone on the broker may publish one, and each used to publish every config
again at once (2,000 births sent 25 MB and kept the device's command answers waiting 13 s). A
birth ``integrations.home_assistant.reannounce_s`` (default 30) or more after the last
announcement (the connect's counts) is answered at once; the births within that interval,
however many, are answered by one announcement at its end (made by the first `tick` then: the
sampler's, every ``telemetry.interval_s``), and logged as held back at most once per
`ThrottledLog` window (10 s).

Threads: `announce` runs on the link's network thread (on connect, on Home Assistant's birth);
`tick` on the sampler's (the frames, and the announcement owed to held-back births). A lock keeps
one announcement at a time; another guards the pacing (the last announcement, one owed).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable

from agent.config.models import AgentConfig
from agent.errors import CodedError
from agent.mqtt.home_assistant import Camera, Identity, discovery, image_topic, status_topic
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import Topics
from agent.throttle import ThrottledLog
from runtimes.files import atomic_write

log = logging.getLogger(__name__)

#: the record of the config topics published, in the state directory
FILE_NAME = "home_assistant.json"
#: the annotated frames' JPEG quality
IMAGE_QUALITY = 70


def cameras_of(config: AgentConfig) -> tuple[Camera, ...]:
    """Each camera of `config` with its lines' and zones' names, its ``classes`` filter and
    whether its health is checked."""
    return tuple(
        Camera(
            p.name,
            tuple(line.name for line in p.lines),
            tuple(zone.name for zone in p.zones),
            tuple(p.classes),
            p.health.enabled,
        )
        for p in config.cameras
    )


class HomeAssistantFeed:
    """Discovery and frames for `identity` over `link`; `camera_jpeg(name, quality)` is a
    camera's newest annotated frame (raises `CodedError` before the first); `clock` is
    monotonic seconds (injected in tests); births are answered at most once per
    ``integrations.home_assistant.reannounce_s`` seconds."""

    def __init__(
        self,
        config: AgentConfig,
        identity: Identity,
        topics: Topics,
        link: MqttLink,
        camera_jpeg: Callable[[str, int], bytes],
        clock: Callable[[], float],
    ) -> None:
        settings = config.integrations.home_assistant
        self.prefix, self.interval_s = settings.discovery_prefix, settings.image_interval_s
        self.identity, self.topics, self.link, self.camera_jpeg, self.clock = identity, topics, link, camera_jpeg, clock
        self.cameras = cameras_of(config)
        self.record = config.state_dir / FILE_NAME
        self._lock = threading.Lock()
        self._last_image: dict[str, float] = {}
        self.reannounce_s = settings.reannounce_s
        self._pacing = threading.Lock()
        self._announced_at: float | None = None  # when the last announcement began (`clock` seconds)
        self._owed = False  # births were held back: one announcement at the interval's end
        self._throttled = ThrottledLog(log, clock=clock)

    def start(self) -> None:
        """Listen for Home Assistant's birth message (call before the link starts)."""
        self.link.subscribe(status_topic(self.prefix), self._on_ha_status)

    def _on_ha_status(self, message: Message) -> None:
        if message.payload.strip() != b"online":
            return
        if self._due(owed_only=False):
            log.info("home assistant came online: announcing %s", self.identity.device)
            self._announce()
        else:
            self._throttled.log(
                logging.INFO,
                "birth",
                "home assistant came online again within %.0f s of the last announcement: held back, "
                "one announcement follows at the interval's end",
                self.reannounce_s,
            )

    def _due(self, owed_only: bool) -> bool:
        """Whether an announcement is due now, and claimed (the last one is now) when it is.
        `owed_only` (the tick): only one owed to births held back. A birth within the interval
        leaves one owed."""
        now = self.clock()
        with self._pacing:
            if self._announced_at is not None and now - self._announced_at < self.reannounce_s:
                self._owed = self._owed or not owed_only
                return False
            if owed_only and not self._owed:
                return False
            self._announced_at, self._owed = now, False
            return True

    def announce(self) -> None:
        """Every entity's retained config, and an empty one for each entity published before
        that the config no longer has (Home Assistant then removes it). Counts as the last
        announcement for the births' pacing."""
        with self._pacing:
            self._announced_at, self._owed = self.clock(), False
        self._announce()

    def _announce(self) -> None:
        with self._lock:
            entities = discovery(self.identity, self.topics, self.prefix, self.cameras)
            topics = [e.topic for e in entities]
            for topic in sorted(set(self._published()) - set(topics)):
                log.info("home assistant: removing %s", topic)
                self.link.publish_state(topic, b"")
            for entity in entities:
                self.link.publish_state(entity.topic, entity.payload())
            self._remember(topics)

    def tick(self) -> None:
        """The announcement owed to held-back births once their interval ended; each camera's
        annotated frame, when `interval_s` has passed since its last one."""
        if self._due(owed_only=True):
            log.info("home assistant: announcing %s for the births held back", self.identity.device)
            self._announce()
        now = self.clock()
        for camera in self.cameras:
            last = self._last_image.get(camera.name)
            if last is not None and now - last < self.interval_s:
                continue
            try:
                jpeg = self.camera_jpeg(camera.name, IMAGE_QUALITY)
            except CodedError:
                continue  # no frame yet (or the camera is gone): the next tick tries again
            self._last_image[camera.name] = now
            self.link.publish_state(image_topic(self.topics, self.identity.device, camera.name), jpeg)

    def _published(self) -> list[str]:
        try:
            topics = json.loads(self.record.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning("home assistant: cannot read %s (%s): entities removed from the config stay", self.record, exc)
            return []
        return [t for t in topics if isinstance(t, str)] if isinstance(topics, list) else []

    def _remember(self, topics: list[str]) -> None:
        try:
            atomic_write(self.record, json.dumps(topics).encode())
        except OSError as exc:
            log.warning("home assistant: cannot write %s: %s", self.record, exc)


def feed_for(
    config: AgentConfig,
    identity: Identity,
    topics: Topics,
    link: MqttLink | None,
    camera_jpeg: Callable[[str, int], bytes],
    clock: Callable[[], float],
) -> HomeAssistantFeed | None:
    """The feed when ``integrations.home_assistant.enabled`` and there is a broker, else None."""
    if link is None or not config.integrations.home_assistant.enabled:
        return None
    return HomeAssistantFeed(config, identity, topics, link, camera_jpeg, clock)
