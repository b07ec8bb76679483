"""End to end: one start and one end per object over a real mosquitto."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from testkit.broker import Broker, Watcher
from testkit.events import BLANK, FPS, camera
from testkit.net import wait_until

from agent.config.models import EventsSection, MqttSection
from agent.mqtt.link import MqttLink
from agent.serving.events import EventSink
from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame
from pipelines.sources.synthetic import CLASS_NAMES
from pipelines.sources.tracking_scene import TrackingScene


def test_one_start_and_one_end_per_object_over_mqtt(tmp_path: Path) -> None:
    """The tracking scene's shapes come and go (passing behind each other) for 900 frames; its
    ground truth stands in for the detector (boxes jittered, shapes under half visible left
    out), the events go through the agent's MQTT link to a real mosquitto."""
    broker = Broker(tmp_path / "broker").start()
    watcher = Watcher(broker, ["edge/d/events"])
    link = MqttLink(MqttSection(broker=broker.url), "events-test").start()
    try:
        assert link.wait_connected(10)
        sink = EventSink(
            EventsSection(min_interval_s=2.0),
            lambda: list(CLASS_NAMES),
            lambda e: link.publish_queued("edge/d/events", json.dumps(e.to_json()).encode()),
            [camera(tracker={"lost_frames": 15})],
        )
        scene, rng = TrackingScene(seed=21, noise=0), np.random.default_rng(0)
        objects: set[int] = set()
        held = []
        for index in range(900):
            truth = scene.render(index)[1]
            seen = truth.visible >= 0.5
            assert truth.ids is not None
            objects |= set(truth.ids[seen].tolist())
            boxes = truth.detections.xyxy[seen] + rng.normal(0, 1.0, (int(seen.sum()), 4))
            found = Detections.from_arrays(boxes, rng.uniform(0.7, 0.95, len(boxes)), truth.detections.class_id[seen])
            sink.handle("cam0", Frame(index, index / FPS, BLANK), found)
            held.append(sink.held())
        sink.finish()
        assert sink.held() == 0, "every track's state is dropped when it ends"
        assert max(held) < 4 * 16, "per-track state follows the live tracks, it does not pile up"
        wait_until(lambda: len(watcher.all_json("edge/d/events")) == sink.published, 20, "every event to arrive")
        events = watcher.all_json("edge/d/events")
    finally:
        watcher.close()
        link.stop()
        broker.stop()
    starts = [e["object_id"] for e in events if e["type"] == "start"]
    ends = [e["object_id"] for e in events if e["type"] == "end"]
    assert len(objects) >= 30, "objects come and go"
    assert len(starts) == len(set(starts)) == len(objects), (len(starts), len(objects))
    assert sorted(ends) == sorted(starts), "every start has its end"
    assert len(events) < 900 / 5, "nothing per frame"
