"""The device's discovery feed (agent.daemon.ha_feed.py) over a real mosquitto: configs
retained on connect, again on Home Assistant's birth, empty retained configs for entities that
left the config, frames at most every ``image_interval_s`` and Home Assistant's births answered
at most once per re-announce interval, both by an injected clock."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from testkit.broker import Broker, Watcher
from testkit.net import wait_until

from agent.config.models import AgentConfig
from agent.daemon.ha_feed import FILE_NAME, HomeAssistantFeed, feed_for
from agent.errors import CodedError, ErrorCode
from agent.mqtt.home_assistant import Identity
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import Topics

ZONE = {"name": "yard", "polygon": [[0, 0], [10, 0], [10, 10]]}
YARD = "homeassistant/sensor/d1/zone_yard_total/config"
TEMPERATURE = "homeassistant/sensor/d1/temperature/config"
#: ``integrations.home_assistant.reannounce_s`` of these tests (not the default 30: the config's is used)
REANNOUNCE_S = 7


def _config(tmp_path: Path, zones: list[dict[str, Any]], enabled: bool = True) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "state_dir": str(tmp_path),
            "mqtt": {"broker": "mqtt://127.0.0.1:1"},
            "cameras": [{"name": "cam0", "source": "synthetic", "zones": zones}],
            "integrations": {
                "home_assistant": {"enabled": enabled, "image_interval_s": 5, "reannounce_s": REANNOUNCE_S}
            },
        }
    )


def _payloads(watcher: Watcher, topic: str) -> list[bytes]:
    return [bytes(m.payload) for m in list(watcher.messages) if m.topic == topic]


class Frames:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, name: str, quality: int) -> bytes:
        self.calls += 1
        if self.calls == 1:
            raise CodedError(ErrorCode.NO_FRAME, "not yet")
        return b"\xff\xd8" + name.encode()


def test_announce_remove_and_frames(tmp_path: Path, broker: Broker) -> None:
    watcher = Watcher(broker, ["homeassistant/#", "edge/d1/ha/#"])
    link = MqttLink(_config(tmp_path, [ZONE]).mqtt.model_copy(update={"broker": broker.url}), "ha-feed")  # type: ignore[union-attr]
    now = [100.0]
    frames = Frames()
    try:
        feed = HomeAssistantFeed(
            _config(tmp_path, [ZONE]), Identity("d1", "pi", "1.0"), Topics(), link, frames, lambda: now[0]
        )
        feed.start()
        link.start()
        assert link.wait_connected(10)
        feed.announce()
        config = watcher.wait_json(YARD, lambda d: d["state_class"] == "total_increasing", 10)
        assert config["device"]["sw_version"] == "1.0"
        assert YARD in (tmp_path / FILE_NAME).read_text()

        feed.tick()  # no frame yet: nothing sent, the next tick tries again
        feed.tick()
        image = "edge/d1/ha/cam0/image"
        assert wait_until(lambda: _payloads(watcher, image), 10, "a frame") == [b"\xff\xd8cam0"]
        now[0] += 4.9  # within image_interval_s: no frame
        feed.tick()
        now[0] += 0.1
        assert frames.calls == 2  # the tick within the interval asked for no frame
        feed.tick()
        wait_until(lambda: len(_payloads(watcher, image)) == 2, 10, "a second frame")
        assert frames.calls == 3

        # the zone leaves the config (a reload builds a new feed): its config is emptied
        again = HomeAssistantFeed(
            _config(tmp_path, []), Identity("d1", "pi", "1.0"), Topics(), link, frames, lambda: now[0]
        )
        again.start()
        again.announce()
        wait_until(lambda: _payloads(watcher, YARD)[-1] == b"", 10, "the yard's config emptied")
        assert YARD not in (tmp_path / FILE_NAME).read_text()

        # Home Assistant's birth, an interval after the last announcement: everything announced again
        now[0] += again.reannounce_s
        before = len(_payloads(watcher, TEMPERATURE))
        watcher.client.publish("homeassistant/status", b"online")
        wait_until(lambda: len(_payloads(watcher, TEMPERATURE)) > before, 10, "discovery again on HA's birth")
    finally:
        link.stop()
        watcher.close()


def test_only_when_enabled_and_with_a_broker(tmp_path: Path) -> None:
    identity = Identity("d1", "pi", "1.0")
    link = MqttLink(_config(tmp_path, []).mqtt, "unused")  # type: ignore[arg-type]
    assert feed_for(_config(tmp_path, [], enabled=False), identity, Topics(), link, Frames(), float) is None
    assert feed_for(_config(tmp_path, []), identity, Topics(), None, Frames(), float) is None
    assert feed_for(_config(tmp_path, []), identity, Topics(), link, Frames(), float) is not None


class NoFrames:
    def __call__(self, name: str, quality: int) -> bytes:
        raise CodedError(ErrorCode.NO_FRAME, "no frames in this test")


def test_births_re_announce_at_most_once_per_interval(
    tmp_path: Path, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 37, item 2: each ``online`` on ``homeassistant/status`` published every config again
    at once (2,000 births sent 25 MB and delayed a signed ping 13 s). By an injected clock: the
    first birth announces at once, a burst within the interval adds one owed announcement, made at
    the first tick at the interval's end, and one log line says the burst was held back. The
    interval is the config's ``reannounce_s`` (a feed that kept a fixed 30 s fails here)."""
    caplog.set_level(logging.INFO, logger="agent.daemon.ha_feed")
    watcher = Watcher(broker, ["homeassistant/#", "test/#"])
    link = MqttLink(_config(tmp_path, []).mqtt.model_copy(update={"broker": broker.url}), "ha-feed")  # type: ignore[union-attr]
    now = [100.0]
    identity = Identity("d1", "pi", "1.0")
    feed = HomeAssistantFeed(_config(tmp_path, []), identity, Topics(), link, NoFrames(), lambda: now[0])
    handled = threading.Event()
    link.subscribe("test/after", lambda message: handled.set())
    marks = [0]

    def births(count: int) -> None:
        """`count` births, and back once the link handled them (a message after them, in order)."""
        handled.clear()
        for _ in range(count):
            watcher.client.publish("homeassistant/status", b"online", qos=1)
        watcher.client.publish("test/after", b"", qos=1)
        assert handled.wait(20), "the births handled"

    def announcements() -> int:
        """How many times the configs were published, once everything the link sent has arrived."""
        marks[0] += 1
        mark = str(marks[0]).encode()
        link.publish_state("test/mark", mark)
        wait_until(lambda: watcher.latest.get("test/mark") == mark, 10, "the link's mark")
        return len(_payloads(watcher, TEMPERATURE))

    try:
        feed.start()
        link.start()
        assert link.wait_connected(10)
        assert announcements() == 0
        births(1)
        assert announcements() == 1, "the first birth is answered at once"
        births(50)
        assert announcements() == 1, "a burst within the interval is answered by no announcement now"
        held = [r for r in caplog.records if "held back" in r.getMessage()]
        assert len(held) == 1, [r.getMessage() for r in caplog.records]
        now[0] += REANNOUNCE_S - 0.1
        feed.tick()
        assert announcements() == 1, "before the interval's end"
        now[0] += 0.1
        feed.tick()
        feed.tick()
        assert announcements() == 2, "the owed announcement at the interval's end, once"
        births(1)
        now[0] += REANNOUNCE_S
        feed.tick()
        assert announcements() == 3, "a birth right after it waits for the next interval's end"
        now[0] += 10 * REANNOUNCE_S
        feed.tick()
        births(1)
        assert announcements() == 4, "after a quiet interval, a birth is answered at once"
    finally:
        link.stop()
        watcher.close()
