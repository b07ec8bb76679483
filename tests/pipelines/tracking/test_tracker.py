"""`pipelines.tracking.tracker`: identities through occlusions, CLEAR-MOT on held-out clips,
confirmation, low scores."""

from __future__ import annotations

import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.tracking import evaluate_tracking

from agent.config.models import TrackerConfig
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.sources.tracking_scene import Mover, TrackingScene
from pipelines.tracking.tracker import ByteTracker, TrackerSettings
from runtimes.registry import load_runtime

RED, BLUE = (40, 40, 220), (220, 90, 30)


def occlusion_scene(speed: float) -> TrackingScene:
    """A circle (id 1, 40 px) moving right at `speed` pixels a frame passes behind a still
    square (id 2, 120 px, drawn on top): at 9.5 px/frame it is less than half visible for 10
    frames, at 20 for 5."""
    return TrackingScene(
        movers=[
            Mover(1, kind=0, size=40, first=0, last=400, start=(40, 240), velocity=(speed, 0), color=RED),
            Mover(2, kind=1, size=120, first=0, last=400, start=(320, 240), velocity=(0, 0), color=BLUE),
        ],
        seed=3,
    )


def follow_circle(detector: Detector, tracker: ByteTracker, speed: float) -> tuple[list[int], int]:
    """The circle's track id in each frame it is over 90 % visible, and the frames it was
    less than half visible."""
    scene = occlusion_scene(speed)
    ids, hidden = [], 0
    for index in range(int(560 / speed)):
        image, truth = scene.render(index)
        assert truth.ids is not None
        circle = int(np.flatnonzero(truth.ids == 1)[0])
        box = truth.detections.xyxy[circle]
        hidden += bool(truth.visible[circle] < 0.5)
        found = track_of(tracker, detector.detect(image), ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2))
        if truth.visible[circle] > 0.9:
            ids.append(found)
    return ids, hidden


def track_of(tracker: ByteTracker, detections: Detections, box_near: tuple[float, float]) -> int:
    tracked = tracker.update(detections).detections
    assert tracked.tracker_id is not None
    centres = (tracked.xyxy[:, :2] + tracked.xyxy[:, 2:]) / 2
    distance = np.linalg.norm(centres - np.array(box_near), axis=1)
    return int(tracked.tracker_id[int(np.argmin(distance))]) if len(tracked) and distance.min() < 20 else -1


@pytest.fixture(scope="module")
def detector() -> Detector:
    runtime = load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx")
    return Detector(runtime, conf=0.1)


@pytest.mark.parametrize(("speed", "hidden_frames"), [(20.0, 5), (9.5, 10)])
def test_an_object_hidden_behind_another_keeps_its_id(detector: Detector, speed: float, hidden_frames: int) -> None:
    """Real detections (demo model on ONNX Runtime) of a circle passing behind a square."""
    ids, hidden = follow_circle(detector, ByteTracker(), speed)
    assert abs(hidden - hidden_frames) <= 1, f"the scene hides the circle {hidden} frames"  # antialiasing varies
    assert ids[3] > 0 and set(ids[3:]) == {ids[3]}, f"one id before and after the occlusion: {ids}"


def test_without_the_lost_track_buffer_the_hidden_object_gets_a_new_id(detector: Detector) -> None:
    """The check above can fail: with no lost-track buffer the circle comes back as a new track."""
    ids, _ = follow_circle(detector, ByteTracker(TrackerSettings(lost_frames=0)), 9.5)
    assert len({i for i in ids if i > 0}) == 2, ids


@pytest.mark.slow
def test_identity_and_clear_mot_metrics_on_a_held_out_clip() -> None:
    """IDF1 and MOTA >= 0.9 (py-motmetrics) on a held-out clip of shapes entering, crossing,
    passing behind each other and leaving; the numbers for more clips: docs/benchmarks.md."""
    scores = evaluate_tracking(DEMO_MODELS / "demo_detector.onnx", clips=2, frames=200)["all"]
    assert scores["num_unique_objects"] >= 15
    assert scores["num_switches"] <= 8, scores  # 6 here (1292 objects); 10 when any overlap may match
    assert scores["idf1"] >= 0.9 and scores["mota"] >= 0.9, scores


def test_ids_are_confirmed_on_the_second_frame_and_end_after_the_buffer() -> None:
    tracker = ByteTracker(TrackerSettings(lost_frames=3))
    box = Detections.from_arrays([[10, 10, 50, 50]], [0.9], [0])
    first, second = tracker.update(box), tracker.update(box)
    assert first.detections.tracker_id is not None and first.detections.tracker_id.tolist() == [-1]
    assert second.started == (1,) and second.detections.tracker_id is not None
    assert second.detections.tracker_id.tolist() == [1]
    ended = [tracker.update(Detections.empty()).ended for _ in range(5)]
    assert ended == [(), (), (), (1,), ()], "lost for 3 frames, ended on the 4th"
    assert tracker.active_ids == []


def test_a_low_score_detection_keeps_a_track_but_never_starts_one() -> None:
    tracker = ByteTracker()
    strong = Detections.from_arrays([[100, 100, 160, 160]], [0.9], [0])
    for _ in range(3):
        tracker.update(strong)
    weak = tracker.update(Detections.from_arrays([[102, 100, 162, 160], [400, 400, 440, 440]], [0.3, 0.3], [0, 0]))
    assert weak.detections.tracker_id is not None and weak.detections.tracker_id.tolist() == [1, -1]
    for _ in range(3):
        tracker.update(Detections.from_arrays([[400, 400, 440, 440]], [0.3], [0]))
    assert tracker.active_ids == [1]


BOX = Detections.from_arrays([[100, 100, 160, 160]], [0.9], [0])


def confirm(tracker: ByteTracker, detections: Detections = BOX) -> int:
    """Two frames of `detections`: the id its track gets on the second."""
    tracker.update(detections)
    step = tracker.update(detections)
    assert step.detections.tracker_id is not None
    return int(step.detections.tracker_id[0])


def test_ids_are_never_reused_after_a_reset() -> None:
    """A camera restart ends every track; the objects seen after it get new ids (an id names one
    track for the tracker's whole life: events and counts key by it)."""
    tracker = ByteTracker()
    assert confirm(tracker) == 1
    assert tracker.reset() == (1,) and tracker.active_ids == []
    assert confirm(tracker) == 2 and tracker.confirmed == 2


def test_the_low_score_round_keeps_only_tracks_matched_last_frame() -> None:
    """A faint detection where a track was lost two frames ago does not take its id (round 2
    is for tracks that were tracked until now); a confident one does (round 1)."""
    tracker = ByteTracker()
    assert confirm(tracker) == 1
    tracker.update(Detections.empty())  # lost
    faint = Detections.from_arrays([[100, 100, 160, 160]], [0.3], [0])
    step = tracker.update(faint)
    assert step.detections.tracker_id is not None and step.detections.tracker_id.tolist() == [-1]
    found = tracker.update(BOX)
    assert found.detections.tracker_id is not None and found.detections.tracker_id.tolist() == [1]


@pytest.mark.parametrize(
    ("new_track_score", "score", "started"), [(0.6, 0.55, False), (0.6, 0.6, True), (0.8, 0.7, False)]
)
def test_only_a_detection_at_new_track_score_starts_a_track(
    new_track_score: float, score: float, started: bool
) -> None:
    """A confident detection (above high_score 0.5) below `new_track_score` keeps tracks but starts none."""
    tracker = ByteTracker(TrackerSettings(new_track_score=new_track_score))
    box = Detections.from_arrays([[100, 100, 160, 160]], [score], [0])
    assert (confirm(tracker, box) > 0) is started
    assert tracker.confirmed == int(started)


def test_the_default_lost_track_buffer_is_two_seconds_at_15_fps() -> None:
    """The documented default (docs/analytics.md, docs/configuration.md: 30 frames, 2 s at 15 FPS),
    the same for a camera's tracker config and the tracker: an object hidden 30 frames keeps its
    id; its track ends on the 31st frame without it."""
    assert TrackerConfig().lost_frames == TrackerSettings().lost_frames == 30
    tracker = ByteTracker()
    assert confirm(tracker) == 1
    for _ in range(30):
        assert tracker.update(Detections.empty()).ended == ()
    assert confirm(tracker) == 1, "back after 30 frames: the same id"
    ended = [tracker.update(Detections.empty()).ended for _ in range(31)]
    assert ended == [()] * 30 + [(1,)]


def test_tracker_id_shape_is_checked() -> None:
    with pytest.raises(ValueError, match=r"tracker_id: expected shape \(1,\)"):
        Detections.from_arrays([[0, 0, 1, 1]], [0.5], [0]).with_tracker_id([1, 2])
    picked = Detections.from_arrays([[0, 0, 1, 1], [2, 2, 3, 3]], [0.5, 0.6], [0, 1]).with_tracker_id([4, 5])[1:]
    assert picked.tracker_id is not None and picked.tracker_id.tolist() == [5]


def box_at(x: float, y: float = 100.0, size: float = 40.0) -> Detections:
    return Detections.from_arrays([[x, y, x + size, y + size]], [0.9], [0])


def test_coasting_keeps_a_seen_track_ages_a_missing_one_and_predicts_a_moving_one() -> None:
    """Frames the motion gate did not infer (`ByteTracker.coast`)."""
    tracker = ByteTracker(TrackerSettings(lost_frames=5))
    for x in (100.0, 110.0, 120.0, 130.0):  # confirmed, moving 10 px a frame
        tracker.update(box_at(x))
    (track_id,) = tracker.active_ids
    for _ in range(3):
        assert tracker.coast() == ()
    step = tracker.update(box_at(170.0))  # where it went meanwhile: the prediction found it
    assert step.detections.tracker_id is not None and step.detections.tracker_id.tolist() == [track_id]
    for _ in range(50):
        assert tracker.coast() == ()  # seen at the last inferred frame: still in view, never ends
    assert tracker.active_ids == [track_id]
    tracker.update(Detections.empty())  # gone at an inferred frame: missing, 1
    ended = [tracker.coast() for _ in range(5)]
    assert ended == [(), (), (), (), (track_id,)], "it ends after lost_frames frames, inferred or not"
    assert tracker.active_ids == []


def test_without_coasting_the_moving_track_is_lost() -> None:
    """The same jump with no prediction between: the check above is not vacuous."""
    tracker = ByteTracker(TrackerSettings(lost_frames=5))
    for x in (100.0, 110.0, 120.0, 130.0):
        tracker.update(box_at(x))
    (track_id,) = tracker.active_ids
    step = tracker.update(box_at(170.0))
    assert step.detections.tracker_id is not None and step.detections.tracker_id.tolist() != [track_id]


def test_an_object_that_stopped_is_found_where_it_stopped_after_the_frames_not_inferred() -> None:
    """The motion gate's case: an object walks (23 px a frame), stops, is inferred for the few
    frames while its motion fades, then a second of frames is not inferred (nothing moved) and
    the keepalive frame finds it where it stopped. Its filter's velocity has not settled, so the
    prediction walked on without it; the track must still match (same id, nothing started), or
    the object would start again and its first track end as gone."""
    tracker = ByteTracker()
    for x in range(0, 230, 23):  # walking in
        tracker.update(box_at(float(x), size=80.0))
    (track_id,) = tracker.active_ids
    for _ in range(4):  # stopped at 230, inferred while its motion fades
        tracker.update(box_at(230.0, size=80.0))
    for _ in range(10):  # a second at 10 FPS without inference
        assert tracker.coast() == ()
    for _ in range(3):  # the keepalive frames, a second apart
        step = tracker.update(box_at(230.0, size=80.0))
        assert step.detections.tracker_id is not None and step.detections.tracker_id.tolist() == [track_id]
        assert step.started == () and step.ended == ()
        for _ in range(9):
            assert tracker.coast() == ()
    assert tracker.active_ids == [track_id] and tracker.confirmed == 1
