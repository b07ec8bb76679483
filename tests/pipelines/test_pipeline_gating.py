"""`Pipeline(gating=...)`: a camera's motion gate in its pipeline (real ONNX Runtime, the demo
detector, testkit's rendered still clip as a video file). The pipeline asks the gate once per
frame, on the file's own time; every frame still reaches the sinks, in order, those not inferred
with the last inferred frame's detections, and never decoded whole (the clip is MJPG)."""

from __future__ import annotations

import itertools
from pathlib import Path

import cv2
import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.media import CountingDecoder
from testkit.motion_clips import still_scene
from testkit.real_models import write_clip

from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.gating import Gating
from pipelines.motion import MotionDetector
from pipelines.motion_gate import MotionGate
from pipelines.pipeline import Pipeline
from pipelines.sources.capture import FileSource
from pipelines.sources.frames import Frame, JpegImage
from runtimes.registry import load_runtime

FRAMES, FPS = 100, 10.0  # the object enters at frame 10, stops 25-60, has left by 80


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("still")
    return write_clip(folder / "still.avi", still_scene().frames(FRAMES), fps=FPS)


def gated(keepalive_fps: float = 2.0, idle_interval_s: float = 2.0) -> Gating:
    return Gating(MotionDetector(), MotionGate(keepalive_fps, idle_interval_s))


def expected_inferred(clip: Path, idle_interval_s: float = 2.0) -> list[int]:
    """The frames the gate admits, asked directly on the decoded file at its own time."""
    capture = cv2.VideoCapture(str(clip))
    gating, admitted, index = gated(idle_interval_s=idle_interval_s), [], 0
    while True:
        ok, image = capture.read()
        if not ok:
            break
        if gating.admit(image, index / FPS):
            admitted.append(index)
        index += 1
    capture.release()
    return admitted


def run(
    clip: Path, gating: Gating | None, workers: int = 1, decoder: CountingDecoder | None = None
) -> tuple[Pipeline, list[tuple[Frame, Detections]]]:
    seen: list[tuple[Frame, Detections]] = []
    detector = Detector(load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx"))
    source = FileSource(clip, decoder=decoder)
    pipeline = Pipeline(
        "cam", source, detector, sinks=[lambda f, d: seen.append((f, d))], workers=workers, gating=gating
    )
    pipeline.start()
    assert pipeline.wait(120)
    pipeline.stop()
    detector.close()
    return pipeline, seen


@pytest.mark.parametrize("workers", [1, 2])
def test_frames_the_gate_lets_through_reach_the_sinks_in_order_with_the_last_detections(
    clip: Path, workers: int
) -> None:
    pipeline, seen = run(clip, gated(), workers)
    assert [f.index for f, _ in seen] == list(range(FRAMES)), "every frame, in order"
    inferred = [f.index for f, _ in seen if f.inferred]
    assert inferred == expected_inferred(clip), "one question per frame, on the file's time"
    assert 10 < len(inferred) < FRAMES - 20, inferred  # the walk in and out, the idle checks
    for (_, before), (frame, detections) in itertools.pairwise(seen):
        if not frame.inferred:
            assert detections is before, f"frame {frame.index}: the last detections stand"
    stats = pipeline.stats()
    assert (stats.frames, stats.inferred) == (FRAMES, len(inferred))
    assert stats.gate is not None and stats.gate.inferred_ratio == pytest.approx(len(inferred) / FRAMES, abs=1e-4)
    assert 0 < stats.gate.motion_ratio < stats.gate.inferred_ratio
    assert stats.rates.frames == FRAMES, "rates count every frame handed on: per frame, as a still scene"


@pytest.mark.parametrize("workers", [1, 2])
def test_frames_the_gate_lets_through_are_never_decoded_whole_and_the_others_once(clip: Path, workers: int) -> None:
    """The MJPG clip's frames come undecoded: the gate judges each on a reduced decode, and only
    the frames it admits are decoded whole, once each (the inference and the sinks share that
    decode); a frame admitted whatever its motion (after motion, the idle interval) is decoded
    first and judged on its pixels, so it needs no reduced decode."""
    decoder = CountingDecoder()
    _pipeline, seen = run(clip, gated(), workers, decoder)
    inferred = [f for f, _ in seen if f.inferred]
    passed = [f for f, _ in seen if not f.inferred]
    assert len(passed) > 20, "the gate let frames through"
    assert all(isinstance(f.pixels, JpegImage) for f, _ in seen)
    assert all(f.pixels.decoded for f in inferred if isinstance(f.pixels, JpegImage))
    assert not any(f.pixels.decoded for f in passed if isinstance(f.pixels, JpegImage)), "no skipped frame decoded"
    assert decoder.full == len(inferred), "each inferred frame decoded once"
    assert len(decoder.calls) < FRAMES + len(inferred), "a frame inferred whatever moves needs no reduced decode"
    later = passed[-1]  # a sink may still read a skipped frame's pixels: decoded then, once
    assert later.image.shape == (360, 640, 3) and later.image is later.image
    assert decoder.full == len(inferred) + 1


def test_the_idle_interval_bounds_the_frames_left_uninferred(clip: Path) -> None:
    _pipeline, seen = run(clip, gated(idle_interval_s=0.5))
    indices = [f.index for f, _ in seen if f.inferred]
    assert indices == expected_inferred(clip, idle_interval_s=0.5)
    assert max(np.diff(indices)) <= 5, "at 10 FPS, no more than 0.5 s between inferred frames"


def test_without_a_gate_every_frame_is_inferred(clip: Path) -> None:
    pipeline, seen = run(clip, None)
    assert all(f.inferred for f, _ in seen) and len(seen) == FRAMES
    stats = pipeline.stats()
    assert (stats.frames, stats.inferred, stats.gate) == (FRAMES, None, None)


class _Broken(MotionDetector):
    def detect(self, frame: np.ndarray):  # type: ignore[no-untyped-def]
        raise RuntimeError("a motion check that broke")


def test_a_motion_check_that_fails_infers_every_frame(clip: Path) -> None:
    pipeline, seen = run(clip, Gating(_Broken(), MotionGate()))
    assert all(f.inferred for f, _ in seen) and pipeline.stats().inferred == FRAMES


@pytest.mark.slow
def test_lines_zones_and_track_starts_are_what_they_are_without_the_gate(tmp_path: Path) -> None:
    """The tracking clip of testkit.tracking (shapes crossing a counting line, some of them
    about as bright as the background in grey, which motion barely sees) plus a triangle standing
    still in a zone from the first frame to the last; the gate's keepalive asks the camera's
    analytics, as the daemon's does. The gated run counts the same crossings, starts every
    track within a second of the ungated run, and ends with the same zone counts."""
    from testkit.tracking import FPS as TRACKING_FPS
    from testkit.tracking import LINE, MOVERS

    from pipelines.sources.tracking_scene import Mover, TrackingScene
    from pipelines.tracking.analytics import SceneAnalytics
    from pipelines.tracking.zones import ZoneSpec

    still = Mover(6, 2, 60, 0, 129, (520.0, 330.0), (0.0, 0.0), (20, 190, 220))
    scene = TrackingScene(movers=[*MOVERS, still], seed=5)
    clip = write_clip(tmp_path / "tracking.avi", [scene.render(i)[0] for i in range(130)], fps=TRACKING_FPS)
    zone = ZoneSpec("corner", ((470, 280), (570, 280), (570, 380), (470, 380)))

    def analysed(gated: bool) -> tuple[SceneAnalytics, dict[int, float], list[Frame]]:
        analytics = SceneAnalytics("cam", lines=[LINE], zones=[zone])
        gating = Gating(MotionDetector(), MotionGate(), analytics.tracks_alive) if gated else None
        starts: dict[int, float] = {}
        frames: list[Frame] = []

        def sink(frame: Frame, detections: Detections) -> None:
            frames.append(frame)
            for record in analytics.update(frame, detections).started:
                starts[record.track_id] = frame.index / TRACKING_FPS

        detector = Detector(load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx"), conf=0.1)
        pipeline = Pipeline("cam", FileSource(clip), detector, sinks=[sink], gating=gating)
        pipeline.start()
        assert pipeline.wait(120)
        pipeline.stop()
        detector.close()
        return analytics, starts, frames

    plain, plain_starts, _ = analysed(gated=False)
    gated, gated_starts, frames = analysed(gated=True)
    assert sum(not f.inferred for f in frames) > 10, "the gate let frames through uninferred"
    assert gated.counts().lines == plain.counts().lines
    assert len(gated_starts) == len(plain_starts)
    for (_, a), (_, b) in zip(sorted(plain_starts.items()), sorted(gated_starts.items()), strict=True):
        assert abs(a - b) <= 1.0
    assert gated.counts().zones == plain.counts().zones


@pytest.mark.slow
def test_an_object_that_stops_for_a_minute_keeps_its_one_track_under_the_default_gate(tmp_path: Path) -> None:
    """A square walks in (1.5 s), stands for a minute, walks out (1.5 s) on the textured scene at
    10 FPS; the default gate (keepalive 1/s, the tracker's 30 lost frames held) asks the
    camera's analytics, as the daemon's does. Its track starts within a second of the ungated
    run's, is in view on every frame of the stop, and is the only one, as without the gate."""
    from pipelines.sources.tracking_scene import Mover, TrackingScene
    from pipelines.tracking.analytics import SceneAnalytics
    from pipelines.tracking.tracker import TrackerSettings

    width, height, walk, stand = 640, 360, 15, 600
    frames = walk + stand + walk
    size, colour, y, stop_x = 64.0, (40, 40, 220), 220.0, 320.0
    speed = (stop_x + size / 2) / walk
    movers = [
        Mover(1, 1, size, 0, walk - 1, (-size / 2, y), (speed, 0.0), colour),
        Mover(2, 1, size, walk, walk + stand - 1, (stop_x, y), (0.0, 0.0), colour),
        Mover(3, 1, size, walk + stand, frames - 1, (stop_x, y), (speed, 0.0), colour),
    ]
    scene = TrackingScene(width, height, seed=3, movers=movers)
    clip = write_clip(tmp_path / "stop.avi", (scene.render(i)[0] for i in range(frames)), fps=FPS)

    def analysed(gated: bool) -> tuple[list[float], list[set[int]], int]:
        analytics = SceneAnalytics("cam")
        gate = MotionGate(track_hold_frames=TrackerSettings().lost_frames)
        gating = Gating(MotionDetector(), gate, analytics.tracks_alive) if gated else None
        starts: list[float] = []
        live: list[set[int]] = []

        def sink(frame: Frame, detections: Detections) -> None:
            starts.extend(frame.index / FPS for _ in analytics.update(frame, detections).started)
            live.append({r.track_id for r in analytics.live()})

        detector = Detector(load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx"))
        pipeline = Pipeline("cam", FileSource(clip), detector, sinks=[sink], gating=gating)
        pipeline.start()
        assert pipeline.wait(300)
        pipeline.stop()
        detector.close()
        return starts, live, gate.inferred

    plain_starts, _, _ = analysed(gated=False)
    gated_starts, live, inferred = analysed(gated=True)
    assert len(plain_starts) == len(gated_starts) == 1, (plain_starts, gated_starts)
    assert abs(plain_starts[0] - gated_starts[0]) <= 1.0
    assert len(live) == frames and inferred < frames // 5, inferred  # mostly coasted: about 1 a second
    standing = live[walk + 5 : walk + stand]
    assert all(ids == standing[0] and len(ids) == 1 for ids in standing), "the stopped square's one track, in view"
