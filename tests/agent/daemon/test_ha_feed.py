"""The device's discovery feed (agent.daemon.ha_feed.py) over a real mosquitto: configs
retained on connect, again on Home Assistant's birth, empty retained configs for entities that
left the config, and frames at most every ``image_interval_s`` by an injected clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def _config(tmp_path: Path, zones: list[dict[str, Any]], enabled: bool = True) -> AgentConfig:
    return AgentConfig.model_validate(
        {
            "state_dir": str(tmp_path),
            "mqtt": {"broker": "mqtt://127.0.0.1:1"},
            "pipelines": [{"name": "cam0", "source": "synthetic", "zones": zones}],
            "integrations": {"home_assistant": {"enabled": enabled, "image_interval_s": 5}},
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

        # Home Assistant's birth: everything announced again
        temperature = "homeassistant/sensor/d1/temperature/config"
        before = len(_payloads(watcher, temperature))
        watcher.client.publish("homeassistant/status", b"online")
        wait_until(lambda: len(_payloads(watcher, temperature)) > before, 10, "discovery again on HA's birth")
    finally:
        link.stop()
        watcher.close()


def test_only_when_enabled_and_with_a_broker(tmp_path: Path) -> None:
    identity = Identity("d1", "pi", "1.0")
    link = MqttLink(_config(tmp_path, []).mqtt, "unused")  # type: ignore[arg-type]
    assert feed_for(_config(tmp_path, [], enabled=False), identity, Topics(), link, Frames(), float) is None
    assert feed_for(_config(tmp_path, []), identity, Topics(), None, Frames(), float) is None
    assert feed_for(_config(tmp_path, []), identity, Topics(), link, Frames(), float) is not None
