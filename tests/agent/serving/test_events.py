"""`agent.serving.events`: one start, rate-limited updates and one end per object, the crop, the counts."""

from __future__ import annotations

import base64

import cv2
import numpy as np
from testkit.events import BLANK, FPS, camera, run, square

from agent.config.models import EventsSection
from agent.event_values import LineCrossing, ObjectEvent
from agent.serving.events import EventSink
from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame
from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene


def test_one_start_updates_at_most_every_interval_and_one_end() -> None:
    """A square walks down through the door line and out of the zone, then vanishes."""
    events: list[ObjectEvent] = []
    sink = EventSink(EventsSection(min_interval_s=1.0), lambda: list(CLASS_NAMES), events.append, [camera()])
    path = [square(100 + 4 * i, 200 + 2 * i, score=0.6 + 0.005 * i) for i in range(60)]  # 4 s at 15 FPS
    run(sink, path + [Detections.empty()] * 8)
    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("start") == kinds.count("end") == 1
    updates = [e for e in events if e.kind == "update"]
    assert 2 <= len(updates) <= 4, "a better score every frame, but one update a second at most"
    assert len({e.object_id for e in events}) == 1, "one object, one event id"
    end = events[-1]
    assert end.lines == (LineCrossing("door", "forward"),)
    first_inside = 0  # x = 100 + 4 i <= 320 up to i = 55
    assert abs(dict(end.zones)["bay"] - (55 - first_inside) / FPS) <= 1 / FPS + 0.0005
    assert abs(end.duration_s - 58 / FPS) <= 1 / FPS + 0.0005, "confirmed on frame 1, last seen 59"
    assert end.label == "circle" and end.to_json()["confidence"] == round(0.6 + 0.005 * 59, 4)
    assert sink.suppressed > 0 and sink.published == len(events)


def test_low_confidence_and_unwanted_labels_make_no_events() -> None:
    events: list[ObjectEvent] = []
    settings = EventsSection(min_confidence=0.8, labels=["square"])
    sink = EventSink(settings, lambda: list(CLASS_NAMES), events.append, [camera()])
    two = Detections.from_arrays([[80, 80, 120, 120], [380, 80, 420, 120]], [0.7, 0.95], [1, 0])
    run(sink, [two] * 10 + [Detections.empty()] * 8)
    assert events == [], "the square is below min_confidence, and circles are not wanted"
    run(sink, [square(100, 100, 0.95, class_id=1) for _ in range(10)] + [Detections.empty()] * 8)
    assert [(e.kind, e.label) for e in events] == [("start", "square"), ("end", "square")]


def test_end_carries_a_jpeg_crop_of_the_best_frame() -> None:
    events: list[ObjectEvent] = []
    sink = EventSink(EventsSection(snapshots=True), lambda: list(CLASS_NAMES), events.append, [camera()])
    image = BLANK.copy()
    image[80:120, 80:120] = (0, 0, 255)
    run(sink, [square(100, 100)] * 5 + [Detections.empty()] * 8, image)
    end = events[-1]
    assert end.snapshot_jpeg is not None
    assert base64.b64decode(str(end.to_json()["snapshot_jpeg"])) == end.snapshot_jpeg, "base64 in JSON"
    crop = cv2.imdecode(np.frombuffer(end.snapshot_jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert crop.shape == (40, 40, 3) and crop[20, 20, 2] > 200 and crop[20, 20, 0] < 50
    assert events[0].snapshot_jpeg is None and "snapshot_jpeg" not in events[0].to_json(), "only the end has it"


def test_counts_follow_the_lines_and_zones() -> None:
    sink = EventSink(EventsSection(), lambda: list(CLASS_NAMES), lambda e: None, [camera()])
    run(sink, [square(100, 200 + 4 * i) for i in range(20)])
    (counts,) = sink.counts()
    assert [(c.name, c.forward, c.backward) for c in counts.lines] == [("door", 1, 0)]
    assert [(z.name, z.now, z.total) for z in counts.zones] == [("bay", 1, 1)]


def test_totals_go_on_from_what_was_kept_and_a_reset_starts_from_zero() -> None:
    """A first sink counts one crossing and one zone entry (saying so through `counted` on each
    frame that changed a total); a second one, restored from its totals, counts on; `reset`
    starts from zero with a new `since`."""
    wall = [5000.0]
    changed: list[int] = []
    first = EventSink(EventsSection(), lambda: list(CLASS_NAMES), lambda e: None, [camera()], lambda: wall[0],
                      counted=lambda: changed.append(1))  # fmt: skip
    run(first, [square(100, 200 + 4 * i) for i in range(20)])
    kept = first.totals()
    assert [(t.kind, t.name, t.a, t.b) for t in kept] == [("line", "door", 1, 0), ("zone", "bay", 1, 0)]
    assert len(changed) == 2, "one call for the frame that entered the zone, one for the crossing"
    wall[0] = 9000.0
    second = EventSink(EventsSection(), lambda: list(CLASS_NAMES), lambda e: None, [camera()], lambda: wall[0])
    assert second.since == 9000.0
    second.restore(kept, since=5000.0)
    assert second.since == 5000.0, "counting since the first start"
    run(second, [square(100, 280 - 4 * i) for i in range(20)])  # back up across the door, inside the bay
    (counts,) = second.counts()
    assert [(c.name, c.forward, c.backward) for c in counts.lines] == [("door", 1, 1)]
    assert [(z.name, z.total) for z in counts.zones] == [("bay", 2)]
    wall[0] = 9500.0
    assert second.reset() == 9500.0 and second.since == 9500.0
    assert [(t.a, t.b) for t in second.totals()] == [(0, 0), (0, 0)]


def test_totals_of_lines_no_longer_configured_are_left_out() -> None:
    from agent.serving.events import SavedTotal

    sink = EventSink(EventsSection(), lambda: list(CLASS_NAMES), lambda e: None, [camera()])
    sink.restore([SavedTotal("cam0", "line", "gone", 9, 9), SavedTotal("cam9", "line", "door", 7, 7),
                  SavedTotal("cam0", "zone", "bay", 4, 0)], since=1.0)  # fmt: skip
    assert [(t.kind, t.name, t.a, t.b) for t in sink.totals()] == [("line", "door", 0, 0), ("zone", "bay", 4, 0)]


def test_the_second_stages_class_goes_on_the_objects_events() -> None:
    """A shape of the synthetic scene stands still; the stage (the demo classifier, real ONNX
    Runtime) is stepped by hand between frames: the start goes out before any answer, the
    answer is news for an update, and the end carries it; the stage forgets the track."""
    from testkit.classifying import demo_stage

    image, truth = SyntheticScene(num_shapes=5, seed=340_001).render(2)
    shown = int(np.flatnonzero(truth.visible > 0.9)[0])
    box, cls = truth.detections.xyxy[shown], int(truth.detections.class_id[shown])
    found = Detections.from_arrays([box], [0.9], [cls])
    events: list[ObjectEvent] = []
    stage, clock = demo_stage()
    sink = EventSink(
        EventsSection(min_interval_s=0.0), lambda: list(CLASS_NAMES), events.append, [camera()], stage=stage
    )
    try:
        sink.handle("cam0", Frame(0, 0.0, image), found)
        sink.handle("cam0", Frame(1, 1 / FPS, image), found)  # confirmed: start, its crop queued
        assert [e.kind for e in events] == ["start"] and events[0].classification is None
        assert "classification" not in events[0].to_json()
        assert stage.waiting() == [("cam0", events[0].track_id)]
        assert stage.step()
        clock.now += 1.0  # before every_s (5 s): not asked again
        sink.handle("cam0", Frame(2, 2 / FPS, image), found)
        assert stage.waiting() == []
        update = events[-1]
        assert update.kind == "update" and update.classification is not None
        assert update.classification.label == CLASS_NAMES[cls]
        document = update.to_json()["classification"]
        assert document == {"label": CLASS_NAMES[cls], "class_id": cls, "score": round(update.classification.score, 4)}
        sink.handle("cam0", Frame(3, 3 / FPS, image), found)
        assert len(events) == 2, "the same answer again is no news"
        clock.now += 4.0  # 5 s since it was asked: again
        sink.handle("cam0", Frame(4, 4 / FPS, image), found)
        assert len(stage.waiting()) == 1
        run_empty = [Detections.empty()] * 8
        for index, detections in enumerate(run_empty, start=5):
            sink.handle("cam0", Frame(index, index / FPS, image), detections)
        end = events[-1]
        assert end.kind == "end" and end.classification == update.classification
        assert stage.held() == 0, "the stage forgets the ended track"
    finally:
        stage.stop()
