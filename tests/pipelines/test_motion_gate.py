"""`MotionGate`'s case table with an injected clock, its boundaries and its counts; and the
gate behind a real `MotionDetector` on a still clip with a lighting change."""

from __future__ import annotations

import numpy as np
import pytest
from testkit.motion_clips import MotionClip

from pipelines.motion import Motion, MotionDetector
from pipelines.motion_gate import MotionGate

STILL = Motion()
MOVING = Motion(np.array([[10, 10, 50, 50]], np.float32), changed=0.02)
LIGHTS = Motion(changed=0.9, recalibrated=True)


def _gate(first: float = 0.0) -> MotionGate:
    """A gate (keepalive 2 fps, idle 5 s) that inferred its first frame at `first`."""
    gate = MotionGate(keepalive_fps=2.0, idle_interval_s=5.0)
    assert gate.decide(first, STILL, tracks_alive=False)  # the first frame is always inferred
    return gate


@pytest.mark.parametrize(
    ("now", "motion", "tracks_alive", "infer"),
    [
        (0.1, STILL, False, False),  # still, no track, long before the idle interval
        (0.1, MOVING, False, True),  # motion
        (0.1, LIGHTS, False, True),  # a lighting change: the scene is new, look once
        (0.1, None, False, True),  # no detector: fail open
        (4.999, STILL, False, False),  # just under the idle interval
        (5.0, STILL, False, True),  # the idle interval reached: >=, not >
        (7.5, STILL, False, True),  # past it
        (0.499, STILL, True, False),  # a track alive, keepalive not due yet
        (0.5, STILL, True, True),  # a track alive, keepalive due (1 / 2 fps): >=, not >
        (0.5, STILL, False, False),  # the same moment without a track
    ],
)
def test_the_case_table(now: float, motion: Motion | None, tracks_alive: bool, infer: bool) -> None:
    assert _gate().decide(now, motion, tracks_alive) is infer


def test_the_first_still_frame_after_motion_is_inferred_then_none() -> None:
    """Where what moved came to rest, or that it left: the frames after it replay its detections."""
    gate = _gate()
    assert gate.decide(1.0, MOVING, tracks_alive=False) and gate.decide(1.1, MOVING, tracks_alive=False)
    assert gate.decide(1.2, STILL, tracks_alive=False), "motion just ended"
    assert not gate.decide(1.3, STILL, tracks_alive=False) and not gate.decide(1.4, STILL, tracks_alive=False)
    assert gate.decide(1.5, LIGHTS, tracks_alive=False) and not gate.decide(1.6, STILL, tracks_alive=False)


def test_the_idle_interval_counts_from_the_last_inferred_frame() -> None:
    gate = _gate()
    assert gate.decide(3.0, MOVING, tracks_alive=False)
    assert gate.decide(3.5, STILL, tracks_alive=False)  # the motion just ended
    assert not gate.decide(8.25, STILL, tracks_alive=False)  # 4.75 s since that frame
    assert gate.decide(8.5, STILL, tracks_alive=False)
    assert not gate.decide(8.75, STILL, tracks_alive=False)


def test_a_stopped_object_is_inferred_at_the_keepalive_rate() -> None:
    gate = _gate()
    decided = [gate.decide(i / 10, STILL, tracks_alive=True) for i in range(1, 31)]  # 10 fps for 3 s
    assert [i + 1 for i, infer in enumerate(decided) if infer] == [5, 10, 15, 20, 25, 30]


def test_counts_and_ratios() -> None:
    gate = MotionGate(keepalive_fps=1.0, idle_interval_s=10.0)
    assert (gate.inferred_ratio, gate.motion_ratio) == (0.0, 0.0)
    for i, motion in enumerate([STILL, MOVING, STILL, STILL, MOVING, LIGHTS, STILL, STILL]):
        gate.decide(i * 0.1, motion, tracks_alive=False)
    # inferred: the first, both with motion, the still one after the first motion, the lights
    assert (gate.offered, gate.inferred, gate.moving) == (8, 5, 2)
    assert gate.inferred_ratio == 0.625 and gate.motion_ratio == 0.25


@pytest.mark.parametrize(
    ("keepalive_fps", "idle_interval_s", "error"),
    [(0.0, 1.0, "keepalive_fps: expected > 0"), (1.0, 0.0, "idle_interval_s: expected > 0")],
)
def test_bad_settings_are_refused(keepalive_fps: float, idle_interval_s: float, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        MotionGate(keepalive_fps, idle_interval_s)


@pytest.mark.parametrize(
    ("now", "motion", "tracks_alive", "infer"),
    [
        (0.1, MOVING, False, True),  # motion is never slowed down
        (0.1, LIGHTS, False, True),
        (14.999, STILL, False, False),  # idle 5 s x3: just under 15 s
        (15.0, STILL, False, True),  # >=, not >
        (1.499, STILL, True, False),  # keepalive period 0.5 s x3
        (1.5, STILL, True, True),
    ],
)
def test_a_slowdown_stretches_the_idle_interval_and_the_keepalive_period(
    now: float, motion: Motion, tracks_alive: bool, infer: bool
) -> None:
    gate = _gate()
    gate.slow_down(3.0)
    assert (gate.slowdown, gate.idle_interval_in_force_s, gate.keepalive_fps_in_force) == (3.0, 15.0, 2.0 / 3)
    assert gate.decide(now, motion, tracks_alive) is infer


def test_a_slowdown_of_one_restores_the_configured_gate() -> None:
    gate = _gate()
    gate.slow_down(4.0)
    assert not gate.decide(5.0, STILL, tracks_alive=False)
    gate.slow_down(1.0)
    assert gate.decide(5.0, STILL, tracks_alive=False)  # the next frame offered sees it
    assert (gate.idle_interval_in_force_s, gate.keepalive_fps_in_force) == (5.0, 2.0)


@pytest.mark.parametrize("factor", [0.5, 0.0, -1.0, float("nan"), float("inf")])
def test_a_slowdown_that_would_speed_up_or_stop_the_gate_is_refused(factor: float) -> None:
    gate = _gate()
    with pytest.raises(ValueError, match="expected a finite factor >= 1"):
        gate.slow_down(factor)
    assert gate.slowdown == 1.0


def test_noise_and_a_lighting_change_do_not_keep_inference_on() -> None:
    clip = MotionClip(seed=21, light_at=45)
    detector, gate = MotionDetector(), MotionGate(keepalive_fps=2.0, idle_interval_s=2.0)
    frames = clip.frames(80)
    decided = [gate.decide(i / 10, detector.detect(frame), tracks_alive=False) for i, frame in enumerate(frames)]
    # the first frame, the idle interval (20 frames), the lighting change once, the idle interval after it
    assert [i for i, infer in enumerate(decided) if infer] == [0, 20, 40, 45, 65]
    assert gate.inferred_ratio == 5 / 80 and gate.motion_ratio == 0.0


def test_the_default_keepalive_infers_a_still_tracked_scene_at_most_once_a_second() -> None:
    """The default is what keeps the still clip within 0.25x the ungated CPU (docs/benchmarks.md):
    a minute at 10 FPS of a standing, tracked object with nothing moving infers the first frame
    and one a second after it, no more (the default raised back to 2/s infers 121)."""
    gate = MotionGate()
    decided = [gate.decide(i / 10, STILL, tracks_alive=True) for i in range(601)]
    assert sum(decided) == 61, sum(decided)
    assert [i for i, infer in enumerate(decided) if infer][:3] == [0, 10, 20]


def test_while_a_track_is_alive_no_slowdown_leaves_more_frames_uninferred_than_the_tracker_keeps() -> None:
    """The longest keepalive and idle interval, slowed down the most (x10): at 15 FPS a tracked
    still scene would go 10 s (150 frames) uninferred; the hold (the tracker's 30 lost frames)
    looks every 30 frames instead. Without a track the idle interval alone applies."""
    gate = MotionGate(keepalive_fps=0.1, idle_interval_s=60.0, track_hold_frames=30)
    gate.slow_down(10.0)
    decided = [gate.decide(i / 15, STILL, tracks_alive=True) for i in range(151)]
    assert [i for i, infer in enumerate(decided) if infer] == [0, 30, 60, 90, 120, 150]
    assert not any(gate.decide(10 + i / 15, STILL, tracks_alive=False) for i in range(1, 151))


def test_a_track_hold_below_one_frame_is_refused() -> None:
    with pytest.raises(ValueError, match="track_hold_frames: expected >= 1"):
        MotionGate(track_hold_frames=0)


def test_a_stopped_object_missed_once_keeps_its_track_under_the_longest_slowdown() -> None:
    """The realistic case behind the hold: HOT's x4 on the default gate (a keepalive every 4 s,
    60 frames at 15 FPS) and the default tracker (30 lost frames); the detector misses a stopped
    object at one keepalive frame. Its track must go on (one start, no end) for the minute it
    stands, as it does without the gate; without the hold it ends while coasting and restarts."""
    from pipelines.decoding.detections import Detections
    from pipelines.sources.frames import Frame
    from pipelines.tracking.analytics import SceneAnalytics
    from pipelines.tracking.tracker import TrackerSettings

    analytics = SceneAnalytics("cam")
    gate = MotionGate(track_hold_frames=TrackerSettings().lost_frames)
    gate.slow_down(4.0)
    seen = Detections.from_arrays([[100.0, 100.0, 160.0, 220.0]], [0.9], [0])
    image = np.zeros((8, 8, 3), np.uint8)
    started, ended, inferred = [], [], 0
    for index in range(15 * 60):
        now = index / 15
        infer = gate.decide(now, MOVING if index < 3 else STILL, analytics.tracks_alive())
        if infer:
            inferred += 1
        missed = infer and inferred == 8  # one keepalive frame, well into the stop, finds nothing
        step = analytics.update(Frame(index, now, image, inferred=infer), Detections.empty() if missed else seen)
        started += [r.track_id for r in step.started]
        ended += [r.track_id for r in step.ended]
    assert (started, ended) == ([1], []), (started, ended)


@pytest.mark.parametrize(
    ("now", "tracks_alive", "due"),
    [
        (0.1, False, False),  # still, no track: a JPEG frame is judged on its reduced decode
        (4.999, False, False),
        (5.0, False, True),  # the idle interval reached: inferred whatever moves
        (0.499, True, False),
        (0.5, True, True),  # a keepalive due
        (0.5, False, False),
    ],
)
def test_due_says_ahead_of_decide_when_a_frame_is_inferred_whatever_its_motion(
    now: float, tracks_alive: bool, due: bool
) -> None:
    gate = _gate()
    assert gate.due(now, tracks_alive) is due
    assert gate.offered == 1, "asking counts nothing"
    assert gate.decide(now, STILL, tracks_alive) is due, "a still frame is inferred exactly when it was due"


def test_due_before_anything_and_after_motion() -> None:
    gate = MotionGate(keepalive_fps=2.0, idle_interval_s=5.0)
    assert gate.due(0.0, tracks_alive=False), "the first frame"
    assert gate.decide(0.0, MOVING, tracks_alive=False)
    assert gate.due(0.1, tracks_alive=False), "the frame after motion"
    assert gate.decide(0.1, STILL, tracks_alive=False)
    assert not gate.due(0.2, tracks_alive=False)


def test_due_counts_the_track_hold_with_the_frame_it_is_asked_for() -> None:
    gate = MotionGate(keepalive_fps=0.1, idle_interval_s=60.0, track_hold_frames=3)
    assert gate.decide(0.0, STILL, tracks_alive=True)
    answers = []
    for i in range(1, 7):
        due = gate.due(i / 15, tracks_alive=True)
        answers.append((due, gate.decide(i / 15, STILL, tracks_alive=True)))
    assert answers == [(False, False), (False, False), (True, True)] * 2
