"""`agent.serving.events` with task models: the demo segmentation and pose models (real ONNX
Runtime) on the scripted tracking scene, a camera each with the same line: the counts equal the
scene's true crossings, and every object's events carry its shape (a mask outline within its
bound, the pose model's 3 keypoints), through the JSON edge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import DEMO_MODELS
from testkit.tracking import FPS, LINE, MOVERS, true_crossings

from agent.config.models import CameraSection, EventsSection
from agent.event_values import ObjectEvent
from agent.serving.events import EventSink
from pipelines.decoding.detector import Detector
from pipelines.sources.frames import Frame
from pipelines.sources.synthetic import CLASS_NAMES
from pipelines.sources.tracking_scene import TrackingScene
from pipelines.tracking.shapes import MAX_POLYGON_POINTS
from runtimes.registry import load_runtime

FRAMES = 130


def _run(model: str, anchor: str | None) -> tuple[EventSink, list[ObjectEvent], list[str]]:
    line: dict[str, object] = {"name": "road", "points": [list(LINE.start), list(LINE.end)]}
    if anchor is not None:
        line["anchor"] = anchor
    section = CameraSection.model_validate({"name": "cam0", "source": "tracking", "lines": [line]})
    events: list[ObjectEvent] = []
    with load_runtime("onnxruntime", Path(DEMO_MODELS / model)) as runtime:
        detector = Detector(runtime, conf=0.1)
        names = runtime.metadata.names or {}
        labels = [names[i] for i in sorted(names)]
        sink = EventSink(EventsSection(min_interval_s=1.0), lambda: labels, events.append, [section])
        scene = TrackingScene(movers=MOVERS, seed=5)
        for index in range(FRAMES):
            image, _ = scene.render(index)
            sink.handle("cam0", Frame(index, index / FPS, image), detector.detect(image))
    sink.finish()
    return sink, events, labels


def _measured(sink: EventSink, labels: list[str]) -> dict[tuple[int, str], int]:
    (count,) = sink.counts()[0].lines
    out = {(CLASS_NAMES.index(label), "forward"): f for label, f, _ in count.by_label if f}
    return out | {(CLASS_NAMES.index(label), "backward"): b for label, _, b in count.by_label if b}


@pytest.mark.parametrize("anchor", [None, "obb_center"])
def test_a_segmentation_camera_counts_the_truth_and_its_events_carry_outlines(anchor: str | None) -> None:
    sink, events, labels = _run("demo_segment.onnx", anchor)
    assert _measured(sink, labels) == true_crossings(MOVERS, FRAMES, LINE)
    ends = [e for e in events if e.kind == "end"]
    assert len(ends) >= len(MOVERS)
    for event in events:
        assert event.shape is not None and event.shape.polygons and not event.shape.keypoints
        shape = json.loads(json.dumps(event.to_json()))["shape"]
        assert sum(len(p) for p in shape["polygons"]) <= MAX_POLYGON_POINTS
        x1, y1, x2, y2 = event.box
        for x, y in (point for part in shape["polygons"] for point in part):
            assert x1 - 2 <= x <= x2 + 2 and y1 - 2 <= y <= y2 + 2, "an outline inside its box"


def test_a_pose_camera_counts_on_its_keypoints_and_its_events_carry_them() -> None:
    """The demo pose model finds triangles (its 3 keypoints: the vertices); the line tests their
    mean: the one triangle of the scene crosses it once, downward."""
    sink, events, labels = _run("demo_pose.onnx", "keypoints:0,1,2")
    assert labels == ["triangle"]
    truth = {key: n for key, n in true_crossings(MOVERS, FRAMES, LINE).items() if CLASS_NAMES[key[0]] == "triangle"}
    assert truth and _measured(sink, labels) == truth
    assert events
    for event in events:
        assert event.shape is not None and len(event.shape.keypoints) == 3 and not event.shape.polygons
        keypoints = event.to_json()["shape"]["keypoints"]  # type: ignore[index]
        assert len(keypoints) == 3 and all(len(k) == 3 for k in keypoints)
