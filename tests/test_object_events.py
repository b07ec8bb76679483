"""Object events: one ``start`` and one ``end`` per object, rate-limited ``update``s, dwell,
crossings and snapshots; over a real mosquitto through the agent's MQTT link."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import cv2
import numpy as np

from agent.config.models import EventsSection, MqttSection, PipelineSection
from agent.mqtt.link import MqttLink
from agent.serving.events import EventSink
from pipelines.detections import Detections
from pipelines.sources import Frame
from pipelines.synthetic import CLASS_NAMES
from pipelines.traffic import TrafficScene
from tests.mqtt_tools import Broker, Watcher, wait_until

FPS = 15.0
BLANK = np.zeros((480, 640, 3), np.uint8)


def square(x: float, y: float, score: float = 0.9, class_id: int = 0) -> Detections:
    return Detections.from_arrays([[x - 20, y - 20, x + 20, y + 20]], [score], [class_id])


def camera(**extra: object) -> PipelineSection:
    return PipelineSection.model_validate(
        {
            "name": "cam0",
            "source": "synthetic",
            "lines": [{"name": "door", "points": [[0, 240], [640, 240]]}],
            "zones": [{"name": "bay", "polygon": [[0, 0], [320, 0], [320, 480], [0, 480]]}],
            "tracker": {"lost_frames": 5},
            **extra,
        }
    )


def run(sink: EventSink, frames: list[Detections], image: np.ndarray = BLANK) -> None:
    for index, detections in enumerate(frames):
        sink.handle("cam0", Frame(index, index / FPS, image), detections)


def test_one_start_updates_at_most_every_interval_and_one_end() -> None:
    """A square walks down through the door line and out of the zone, then vanishes."""
    events: list[dict[str, object]] = []
    sink = EventSink(EventsSection(min_interval_s=1.0), lambda: list(CLASS_NAMES), events.append, [camera()])
    path = [square(100 + 4 * i, 200 + 2 * i, score=0.6 + 0.005 * i) for i in range(60)]  # 4 s at 15 FPS
    run(sink, path + [Detections.empty()] * 8)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("start") == kinds.count("end") == 1
    updates = [e for e in events if e["type"] == "update"]
    assert 2 <= len(updates) <= 4, "a better score every frame, but one update a second at most"
    end = events[-1]
    assert end["lines"] == [{"line": "door", "direction": "forward"}]
    first_inside = 0  # x = 100 + 4 i <= 320 up to i = 55
    assert abs(end["zones"]["bay"] - (55 - first_inside) / FPS) <= 1 / FPS + 0.0005  # type: ignore[index]
    assert abs(float(end["duration_s"]) - 58 / FPS) <= 1 / FPS + 0.0005, "confirmed on frame 1, last seen 59"
    assert end["label"] == "circle" and end["confidence"] == round(0.6 + 0.005 * 59, 4)
    assert sink.suppressed > 0 and sink.published == len(events)


def test_low_confidence_and_unwanted_labels_make_no_events() -> None:
    events: list[dict[str, object]] = []
    settings = EventsSection(min_confidence=0.8, labels=["square"])
    sink = EventSink(settings, lambda: list(CLASS_NAMES), events.append, [camera()])
    two = Detections.from_arrays([[80, 80, 120, 120], [380, 80, 420, 120]], [0.7, 0.95], [1, 0])
    run(sink, [two] * 10 + [Detections.empty()] * 8)
    assert events == [], "the square is below min_confidence, and circles are not wanted"
    run(sink, [square(100, 100, 0.95, class_id=1) for _ in range(10)] + [Detections.empty()] * 8)
    assert [(e["type"], e["label"]) for e in events] == [("start", "square"), ("end", "square")]


def test_end_carries_a_jpeg_crop_of_the_best_frame() -> None:
    events: list[dict[str, object]] = []
    sink = EventSink(EventsSection(snapshots=True), lambda: list(CLASS_NAMES), events.append, [camera()])
    image = BLANK.copy()
    image[80:120, 80:120] = (0, 0, 255)
    run(sink, [square(100, 100)] * 5 + [Detections.empty()] * 8, image)
    crop = cv2.imdecode(np.frombuffer(base64.b64decode(str(events[-1]["snapshot_jpeg"])), np.uint8), cv2.IMREAD_COLOR)
    assert crop.shape == (40, 40, 3) and crop[20, 20, 2] > 200 and crop[20, 20, 0] < 50
    assert "snapshot_jpeg" not in events[0], "only the end carries the crop"


def test_counts_follow_the_lines_and_zones() -> None:
    sink = EventSink(EventsSection(), lambda: list(CLASS_NAMES), lambda e: None, [camera()])
    run(sink, [square(100, 200 + 4 * i) for i in range(20)])
    (counts,) = sink.counts()
    assert [(c.name, c.forward, c.backward) for c in counts.lines] == [("door", 1, 0)]
    assert [(z.name, z.now, z.total) for z in counts.zones] == [("bay", 1, 1)]


def test_one_start_and_one_end_per_object_over_mqtt(tmp_path: Path) -> None:
    """The traffic scene's shapes come and go (passing behind each other) for 900 frames; its
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
            lambda e: link.publish_queued("edge/d/events", json.dumps(e).encode()),
            [camera(tracker={"lost_frames": 15})],
        )
        scene, rng = TrafficScene(seed=21, noise=0), np.random.default_rng(0)
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
