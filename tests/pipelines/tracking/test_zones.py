"""`pipelines.tracking.zones` and `pipelines.tracking.analytics`: line counts equal the true crossings, the
dead band, zone occupancy and dwell, labels, bad specs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from testkit import DEMO_MODELS
from testkit.tracking import FPS, LINE, MOVERS, true_crossings

from agent.config.models import AgentConfig
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.sources.frames import Frame
from pipelines.sources.synthetic import CLASS_NAMES
from pipelines.sources.tracking_scene import TrackingScene
from pipelines.tracking.analytics import SceneAnalytics
from pipelines.tracking.zones import ZoneCount, ZoneCounter, ZoneSpec
from runtimes.registry import load_runtime


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector(load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx"), conf=0.1)


def test_line_counts_equal_the_true_crossings(detector: Detector) -> None:
    scene = TrackingScene(movers=MOVERS, seed=5)
    analytics = SceneAnalytics("cam0", lines=[LINE], label=lambda c: CLASS_NAMES[c])
    for index in range(130):
        image, _ = scene.render(index)
        analytics.update(Frame(index, index / FPS, image), detector.detect(image))
    truth = true_crossings(MOVERS, 130, LINE)
    assert truth == {(0, "forward"): 1, (1, "backward"): 1, (2, "forward"): 1}, "the scene is what it claims"
    (count,) = analytics.counts().lines
    measured = {(CLASS_NAMES.index(label), "forward"): f for label, f, _ in count.by_label if f}
    measured |= {(CLASS_NAMES.index(label), "backward"): b for label, _, b in count.by_label if b}
    assert measured == truth
    assert (count.forward, count.backward) == (2, 1)


def boxes_at(centres: list[tuple[float, float]], size: float = 40) -> Detections:
    xy = np.array(centres, np.float32).reshape(-1, 2)
    return Detections.from_arrays(
        np.concatenate([xy - size / 2, xy + size / 2], axis=1), [0.9] * len(xy), [0] * len(xy)
    )


def test_jitter_around_the_line_counts_nothing_and_a_crossing_counts_once() -> None:
    analytics = SceneAnalytics("cam0", lines=[LINE])
    wobble = [240.0 + 3 * (-1) ** i for i in range(20)]  # 3 px either side of the line, every frame
    approach, back = list(range(200, 236, 4)), list(range(280, 244, -5))
    path = approach + wobble + [250.0, 260.0, 270.0, 280.0] + back + wobble + back[::-1]
    crossings = []
    for index, y in enumerate(path):
        crossings += analytics.update(
            Frame(index, index / FPS, np.zeros((480, 640, 3), np.uint8)), boxes_at([(100, y)])
        ).crossings
    assert [(c.track_id, c.direction) for c in crossings] == [(1, "forward")]


def test_the_line_counter_can_fail_without_its_dead_band() -> None:
    """With no dead band the same wobble counts every swing: the check above is not vacuous."""
    analytics = SceneAnalytics("cam0", lines=[LINE])
    analytics.lines[0].margin_px = analytics.lines[0].height_fraction = 0.0
    for index, y in enumerate([*range(200, 236, 4), *(240 + 3 * (-1) ** i for i in range(10))]):
        analytics.update(Frame(index, index / FPS, np.zeros((480, 640, 3), np.uint8)), boxes_at([(100, y)]))
    assert analytics.counts().lines[0].forward > 1


def test_zone_occupancy_and_dwell_within_one_frame_interval() -> None:
    zone = ZoneSpec("bay", ((200, 100), (400, 100), (400, 300), (200, 300)))
    analytics = SceneAnalytics("cam0", zones=[zone], tracker=None)
    speeds = {1: 4.0, 2: 7.0}  # two objects crossing the zone left to right at different speeds
    true_dwell = {t: sum(1 for i in range(200) if 200 <= 40 + v * i <= 400) / FPS for t, v in speeds.items()}
    ended = []
    occupancy = []
    for index in range(200):
        centres = [(40 + v * index, 150.0 + 80 * (t - 1)) for t, v in speeds.items() if 40 + v * index < 640]
        frame = Frame(index, index / FPS, np.zeros((480, 640, 3), np.uint8))
        ended += analytics.update(frame, boxes_at(centres)).ended
        occupancy.append(analytics.counts().zones[0].now)
    ended += analytics.finish()
    dwell = {r.track_id: dict(r.zones)["bay"] for r in ended}
    assert dwell.keys() == true_dwell.keys()
    for track_id, seconds in dwell.items():
        assert abs(seconds - true_dwell[track_id]) <= 1 / FPS + 0.0005, (track_id, seconds)  # rounded to ms
    assert max(occupancy) == 2 and occupancy[-1] == 0
    assert analytics.counts().zones[0].total == 2


def test_a_track_that_leaves_and_comes_back_counts_once_and_its_visits_add_up() -> None:
    """`total` counts distinct tracks: track 1 in, out, in again is one; its dwell is both visits."""
    counter = ZoneCounter(ZoneSpec("bay", ((0, 0), (100, 0), (100, 100), (0, 100))))
    inside, outside = np.array([[50.0, 50.0]]), np.array([[300.0, 50.0]])
    one = np.array([1], np.int32)
    entered = [counter.update(now, one, where, ["person"]) for now, where in enumerate([inside, outside, inside])]
    assert entered == [[1], [], [1]], "each visit is an entry"
    assert counter.count() == ZoneCount("bay", 1, 1)
    counter.update(3.5, one, inside, ["person"])
    assert counter.forget(1) == 1.0 + 1.5, "0 s to 1 s, then 2 s to 3.5 s"
    counter.update(4.0, np.array([2], np.int32), inside, ["person"])
    assert counter.count().total == 2


def test_zone_labels_filter_what_counts() -> None:
    zone = ZoneSpec("bay", ((0, 0), (640, 0), (640, 480), (0, 480)), frozenset({"square"}))
    analytics = SceneAnalytics("cam0", zones=[zone], label=lambda c: CLASS_NAMES[c])
    both = Detections.from_arrays([[10, 10, 50, 50], [100, 100, 150, 150]], [0.9, 0.9], [0, 1])
    for index in range(3):
        analytics.update(Frame(index, index / FPS, np.zeros((480, 640, 3), np.uint8)), both)
    assert analytics.counts().zones[0].now == 1


def config(**pipeline: Any) -> AgentConfig:
    return AgentConfig.model_validate({"cameras": [{"source": "synthetic", **pipeline}]})


@pytest.mark.parametrize(
    ("pipeline", "error"),
    [
        ({"lines": [{"name": "a", "points": [[0, 0]]}]}, "a line has exactly 2 points"),
        ({"lines": [{"name": "a", "points": [[0, 0], [1, 1], [2, 2]]}]}, "a line has exactly 2 points"),
        ({"lines": [{"name": "a", "points": [[5, 5], [5, 5]]}]}, "a line's two points must differ"),
        ({"lines": [{"name": "a", "points": [[0, 0, 0], [1, 1]]}]}, r"a point is \[x, y\]"),
        ({"lines": [{"name": "a b", "points": [[0, 0], [1, 1]]}]}, "may only hold letters"),
        ({"zones": [{"name": "z", "polygon": [[0, 0], [1, 1]]}]}, "at least 3 points, got 2"),
        ({"zones": [{"name": "z", "polygon": [[0, 0], [1, 1], [2, "x"]]}]}, "polygon.2.1"),
        ({"tracker": {"low_score": 0.7, "high_score": 0.5}}, r"low_score \(0.7\) must not exceed"),
    ],
)
def test_bad_lines_and_zones_are_refused_with_their_place(pipeline: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        config(**pipeline)


def test_frames_not_inferred_keep_a_still_object_in_its_zone_and_count_no_crossing() -> None:
    """A frame the motion gate let through (`Frame.inferred` False) coasts: the object seen at the
    last inferred frame stays where it was for the zone (its dwell grows with the frames' time)
    and its record, no line is crossed, and the replayed detections are not tracked again."""
    from dataclasses import replace

    from pipelines.tracking.tracker import TrackerSettings

    zone = ZoneSpec("bay", ((0, 0), (300, 0), (300, 300), (0, 300)))
    line = LINE  # y = 240 across the frame: the box below never reaches it
    analytics = SceneAnalytics("cam0", lines=[line], zones=[zone], tracker=TrackerSettings(lost_frames=5))
    image = np.zeros((480, 640, 3), np.uint8)
    for index in range(3):  # confirmed, inside the zone
        analytics.update(Frame(index, index / FPS, image), boxes_at([(100, 100)]))
    (record,) = analytics.live()
    far = boxes_at([(600, 400)])  # what a replay could carry: never tracked on a coasting frame
    for index in range(3, 3 + 45):
        step = analytics.update(replace(Frame(index, index / FPS, image), inferred=False), far)
        assert step.crossings == () and step.ended == () and step.started == ()
    (kept,) = analytics.live()
    assert kept.track_id == record.track_id and kept.last_ts == pytest.approx(47 / FPS)
    assert dict(kept.zones)["bay"] == pytest.approx(47 / FPS, abs=1 / FPS), "3 s of dwell, 45 of them coasted"
    assert analytics.counts().zones[0].now == 1 and analytics.counts().lines[0].forward == 0
    analytics.update(Frame(48, 48 / FPS, image), Detections.empty())  # gone, at an inferred frame
    ends = [analytics.update(replace(Frame(i, i / FPS, image), inferred=False), far).ended for i in range(49, 54)]
    assert [len(e) for e in ends] == [0, 0, 0, 0, 1] and analytics.counts().zones[0].now == 0
