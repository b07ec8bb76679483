"""`pipelines.health_watch.HealthWatch`: frames offered at the camera's rate are judged one every
`interval_s` of capture time; a problem's start and end are reported once each, with the Unix
time its condition began; a reference reset asked from another thread takes effect on the next
frame; a frame the check cannot take is skipped. And in a `Pipeline` (real ONNX Runtime, the demo
detector): the capture thread offers every frame read, and `stats().health` has the state."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.health_clips import HealthScene, covered, warped

from pipelines.camera_health import HealthThresholds
from pipelines.decoding.detector import Detector
from pipelines.health_watch import HealthWatch, ProblemSeen
from pipelines.pipeline import Pipeline
from pipelines.sources.frames import Frame
from runtimes.registry import load_runtime

WALL = 1_700_000_000.0  # the Unix time at capture time 0
SCENE = HealthScene(320, 180, seed=3)


def image(second: int, covered_from: int | None = None, covered_to: int | None = None) -> np.ndarray:
    picture = SCENE.render(second)
    if covered_from is not None and covered_from <= second < (covered_to or 10**9):
        return covered(picture, second)
    return picture


class Changes:
    """What a watch reported, as (capture second, started kinds, cleared kinds)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.seen: list[tuple[float, tuple[ProblemSeen, ...], tuple[ProblemSeen, ...]]] = []

    def __call__(self, camera: str, started: tuple[ProblemSeen, ...], cleared: tuple[ProblemSeen, ...]) -> None:
        assert camera == "gate"
        self.seen.append((self.now, started, cleared))


def watch(changes: Changes, **thresholds: float) -> HealthWatch:
    return HealthWatch("gate", HealthThresholds(**thresholds), changes, wall=lambda: WALL + changes.now)


def feed(health: HealthWatch, changes: Changes, seconds: range, per_second: int = 1, **picture: int) -> None:
    for second in seconds:
        for k in range(per_second):
            changes.now = second + k / per_second
            health.offer(Frame(second * per_second + k, changes.now, image(second, **picture)))


def test_frames_are_judged_one_every_interval_of_capture_time() -> None:
    changes = Changes()
    health, judged = watch(changes, interval_s=2.0), []
    for second in range(20):
        for k in range(4):  # a 4 fps camera
            changes.now = second + k / 4
            health.offer(Frame(second * 4 + k, changes.now, image(second)))
            if health.state is not None and (not judged or judged[-1] != health.state.at):
                judged.append(health.state.at)
    assert [at - WALL for at in judged] == [float(s) for s in range(0, 20, 2)]


def test_a_problem_is_reported_once_when_it_starts_and_once_when_it_clears() -> None:
    changes = Changes()
    health = watch(changes)  # hold_s 10
    feed(health, changes, range(60), per_second=2, covered_from=20, covered_to=40)
    assert [(now, [p.kind for p in started], [p.kind for p in cleared]) for now, started, cleared in changes.seen] == [
        (30.0, ["covered"], []),
        (40.0, [], ["covered"]),
    ]
    problem = changes.seen[0][1][0]
    assert problem.since == WALL + 20, "since: when the lens was covered, not when it was reported"
    assert changes.seen[1][2][0].since == WALL + 20
    assert health.state is not None and health.state.problems == ()


def test_a_problem_keeps_its_start_while_it_lasts() -> None:
    changes = Changes()
    health = watch(changes)
    feed(health, changes, range(40), covered_from=20)
    assert health.state is not None and [(p.kind, p.since) for p in health.state.problems] == [("covered", WALL + 20)]
    assert len(changes.seen) == 1


def test_a_reference_reset_from_another_thread_clears_moved_on_the_next_frame() -> None:
    changes = Changes()
    health = watch(changes, reference_after_s=5.0, hold_s=2.0)
    feed(health, changes, range(20))
    for second in range(20, 30):  # the camera knocked sideways
        changes.now = float(second)
        health.offer(Frame(second, changes.now, warped(SCENE.render(second), shift_fraction=0.1)))
    assert health.state is not None and health.state.kinds == ("moved",)
    reference = health.reference
    health.reset_reference()
    assert health.state.kinds == ("moved",), "nothing changes until the capture thread's next frame"
    changes.now = 30.0
    health.offer(Frame(30, 30.0, warped(SCENE.render(30), shift_fraction=0.1)))
    assert health.state.kinds == ()
    assert changes.seen[-1][0] == 30.0 and [p.kind for p in changes.seen[-1][2]] == ["moved"]
    assert health.reference is not None and health.reference is not reference


def test_a_frame_the_check_cannot_take_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    changes = Changes()
    health = watch(changes)
    health.offer(Frame(0, 0.0, image(0)))
    state = health.state
    for second in (1, 2):
        health.offer(Frame(second, float(second), np.zeros((8, 8, 3), np.uint8)))  # too small to judge
    assert health.state is state
    assert sum("health check failed" in r.message for r in caplog.records) == 1, "logged once"
    health.offer(Frame(3, 3.0, image(3)))
    assert health.state is not state


class ClipSource:
    """A file-like `FrameSource` of the rendered scene, one frame a second of capture time."""

    name, live = "clip", False

    def __init__(self, frames: int, covered_from: int) -> None:
        self._frames, self._covered_from = frames, covered_from
        self._index: Iterator[int] = iter(range(frames))

    def open(self) -> None:
        pass

    def read(self) -> Frame | None:
        second = next(self._index, None)
        return None if second is None else Frame(second, float(second), image(second, self._covered_from))

    def close(self) -> None:
        pass


def test_the_pipeline_offers_every_frame_read_and_reports_the_state() -> None:
    changes = Changes()
    health = HealthWatch("gate", HealthThresholds(), changes, wall=lambda: WALL)
    detector = Detector(load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx"))
    pipeline = Pipeline("gate", ClipSource(40, covered_from=20), detector, health=health)
    assert pipeline.stats().health is None
    pipeline.start()
    assert pipeline.wait(120)
    pipeline.stop()
    detector.close()
    state = pipeline.stats().health
    assert state is not None and state.kinds == ("covered",)
    assert [[p.kind for p in started] for _, started, _ in changes.seen] == [["covered"]]


def test_a_change_report_that_fails_is_logged_once_and_the_check_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    changes = Changes()

    def broken(camera: str, started: tuple[ProblemSeen, ...], cleared: tuple[ProblemSeen, ...]) -> None:
        raise RuntimeError("the outbox is gone")

    health = HealthWatch("gate", HealthThresholds(), broken, wall=lambda: WALL + changes.now)
    feed(health, changes, range(60), covered_from=20, covered_to=40)  # a start and an end: two reports
    assert sum("reporting a change" in r.message for r in caplog.records) == 1
    assert health.state is not None and health.state.problems == () and health.state.at == WALL + 59
