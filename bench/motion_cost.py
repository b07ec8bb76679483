#!/usr/bin/env python3
"""What the motion gate (docs/cameras.md "Motion") saves and what it costs in events: a camera's
whole pipeline (decode, motion, preprocessing, inference, decoding, tracking) on rendered clips,
with and without the gate, side by side in one run.

Clips (MJPG .avi at 10 FPS, rendered into a temporary folder, `pipelines.sources.tracking_scene`):
- ``still``: the textured background with one shape that walks in for 1.5 s, stands for most of
  the clip, and walks out over the last 1.5 s (a parking lot at night);
- ``busy``: shapes crossing all the time (the ``tracking`` source's seeded traffic).

Each round runs every (clip, resolution) once without and once with the gate (the order swapped
every other round), each in this process with its own pipeline; it reports the process's CPU
seconds (user + system, all threads) per minute of video, the frames inferred, and the event
recall: the share of the ungated run's track starts that the gated run also has, of the same
class, within 1 s. Medians over the rounds, and the gated/ungated ratio of each round's CPU; the
machine's 1-minute load average before and after (on a shared machine, what else ran).

    python bench/motion_cost.py [--model MODEL] [--seconds 30] [--rounds 3] [--sizes 1280x720,1920x1080]
        [--clips still,busy] [--keepalive-fps 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from pipelines.decoding.detections import Detections  # noqa: E402
from pipelines.decoding.detector import CameraDetector, Detector  # noqa: E402
from pipelines.gating import Gating  # noqa: E402
from pipelines.motion import MotionDetector  # noqa: E402
from pipelines.motion_gate import KEEPALIVE_FPS, MotionGate  # noqa: E402
from pipelines.pipeline import Pipeline, use_one_opencv_thread  # noqa: E402
from pipelines.sources.capture import FileSource  # noqa: E402
from pipelines.sources.frames import Frame  # noqa: E402
from pipelines.sources.tracking_scene import Mover, TrackingScene  # noqa: E402
from pipelines.tracking.analytics import SceneAnalytics  # noqa: E402
from pipelines.tracking.tracker import TrackerSettings  # noqa: E402
from runtimes.registry import load_runtime  # noqa: E402

FPS = 10.0
DEMO = REPO / "agent" / "demo" / "demo_detector.onnx"


def still_movers(frames: int, width: int, height: int) -> list[Mover]:
    """One shape walking in (15 frames), standing, walking out (15 frames): three scripted
    movers drawn alike, so it reads as one object."""
    size, colour, y = 0.1 * width, (40, 40, 220), 0.6 * height
    stop_x, walk = width / 2, 15
    speed = (stop_x + size / 2) / walk
    return [
        Mover(1, 1, size, 0, walk - 1, (-size / 2, y), (speed, 0.0), colour),
        Mover(2, 1, size, walk, frames - walk - 1, (stop_x, y), (0.0, 0.0), colour),
        Mover(3, 1, size, frames - walk, frames - 1, (stop_x, y), (speed, 0.0), colour),
    ]


def render(folder: Path, kind: str, width: int, height: int, frames: int) -> Path:
    scene = (
        TrackingScene(width, height, seed=3, movers=still_movers(frames, width, height))
        if kind == "still"
        else TrackingScene(width, height, seed=3, max_speed=6.0 * width / 640)
    )
    path = folder / f"{kind}-{width}x{height}.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (width, height))
    for index in range(frames):
        writer.write(scene.render(index)[0])
    writer.release()
    return path


@dataclass(frozen=True)
class Run:
    cpu_s: float
    frames: int
    inferred: int
    starts: tuple[tuple[int, float], ...]  # (class id, seconds into the clip) of each track's start


def run(model: Path, clip: Path, gated: bool, keepalive_fps: float = KEEPALIVE_FPS) -> Run:
    """The clip through one camera's pipeline, its CPU seconds and its track starts."""
    analytics = SceneAnalytics("bench")
    starts: list[tuple[int, float]] = []

    def sink(frame: Frame, detections: Detections) -> None:
        for record in analytics.update(frame, detections).started:
            starts.append((record.class_id, frame.index / FPS))

    detector = Detector(load_runtime("onnxruntime", model))
    camera = CameraDetector(detector, detector.detection_filter)
    gate = MotionGate(keepalive_fps, track_hold_frames=TrackerSettings().lost_frames)  # as the daemon's
    gating = Gating(MotionDetector(), gate, analytics.tracks_alive) if gated else None
    pipeline = Pipeline("bench", FileSource(clip), camera, sinks=[sink], gating=gating)
    before = resource.getrusage(resource.RUSAGE_SELF)
    pipeline.start()
    pipeline.wait()
    after = resource.getrusage(resource.RUSAGE_SELF)
    pipeline.stop()
    detector.close()
    stats = pipeline.stats()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    inferred = stats.inferred if stats.inferred is not None else stats.frames
    return Run(cpu, stats.frames, inferred, tuple(starts))


def recall(plain: tuple[tuple[int, float], ...], gated: tuple[tuple[int, float], ...]) -> float:
    """The share of `plain`'s starts that `gated` has too: same class, within 1 s (one to one)."""
    if not plain:
        return 1.0
    left = list(gated)
    found = 0
    for class_id, at in plain:
        match = next((g for g in left if g[0] == class_id and abs(g[1] - at) <= 1.0), None)
        if match is not None:
            left.remove(match)
            found += 1
    return found / len(plain)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=DEMO, help="an .onnx detector (default: the demo's)")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of video per clip, at 10 FPS")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="1280x720,1920x1080")
    parser.add_argument("--clips", default="still,busy", help="which clips: still, busy or both")
    parser.add_argument(
        "--keepalive-fps", type=float, default=KEEPALIVE_FPS, help=f"the gate's keepalive (default {KEEPALIVE_FPS:g})"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    use_one_opencv_thread()
    load_before = os.getloadavg()[0]  # the machine may be shared: what else ran is part of the numbers
    frames = int(args.seconds * FPS)
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="motion-cost-") as tmp:
        kinds = args.clips.split(",")
        clips = {(k, w, h): render(Path(tmp), k, w, h, frames) for k in kinds for w, h in sizes}
        runs: dict[tuple[str, int, int], list[tuple[Run, Run]]] = {key: [] for key in clips}
        for n in range(args.rounds):
            for key, clip in clips.items():
                keepalive = args.keepalive_fps
                if n % 2:
                    gated, plain = run(args.model, clip, True, keepalive), run(args.model, clip, False)
                else:
                    plain, gated = run(args.model, clip, False), run(args.model, clip, True, keepalive)
                runs[key].append((plain, gated))
        minutes = frames / FPS / 60
        for (kind, w, h), pairs in runs.items():
            plain_cpu = statistics.median(p.cpu_s for p, _ in pairs) / minutes
            gated_cpu = statistics.median(g.cpu_s for _, g in pairs) / minutes
            rows.append(
                {
                    "clip": kind,
                    "size": f"{w}x{h}",
                    "frames": pairs[0][0].frames,
                    "inferred": statistics.median(g.inferred for _, g in pairs),
                    "cpu_s_per_min": round(plain_cpu, 2),
                    "gated_cpu_s_per_min": round(gated_cpu, 2),
                    "ratio": round(statistics.median(g.cpu_s / p.cpu_s for p, g in pairs), 3),
                    "event_recall": round(min(recall(p.starts, g.starts) for p, g in pairs), 3),
                    "events": len(pairs[0][0].starts),
                }
            )
    load = (round(load_before, 2), round(os.getloadavg()[0], 2))
    if args.json:
        report = {"model": args.model.name, "seconds": args.seconds, "rounds": args.rounds, "rows": rows}
        report["load_avg_1min"] = load  # before and after
        print(json.dumps({**report, "keepalive_fps": args.keepalive_fps}))
        return 0
    print(
        f"{args.model.name}, {args.seconds:g} s clips at {FPS:g} FPS, keepalive {args.keepalive_fps:g}/s, "
        f"{args.rounds} rounds (medians), 1-min load average {load[0]:g} before, {load[1]:g} after"
    )
    print(f"{'clip':<7}{'size':<11}{'inferred':>14}{'CPU s/min':>11}{'gated':>9}{'ratio':>8}{'recall':>8}{'events':>8}")
    for r in rows:
        print(
            f"{r['clip']:<7}{r['size']:<11}{r['inferred']:>7g} of {r['frames']:<4}{r['cpu_s_per_min']:>11.2f}"
            f"{r['gated_cpu_s_per_min']:>9.2f}{r['ratio']:>8.3f}{r['event_recall']:>8.3f}{r['events']:>8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
