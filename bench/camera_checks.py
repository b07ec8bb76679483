#!/usr/bin/env python3
"""Benchmark: the CPU one camera's health check and drift cost together, as a share of a core
(issue 40; goal: under 2 % of a core at the default rate), at 720p and 1080p.

A camera of `--fps` frames a second (default 15, the synthetic source's rate), every frame
inferred (the most drift work), for `--seconds` of its clock: each frame goes to
`pipelines.health_watch.HealthWatch.offer` as the capture thread hands it (judged once every
``health.interval_s`` = 1 s, the default; the others cost a comparison) and, with its detections,
to `agent.serving.drift_watch.DriftWatch.observe` as the camera's sink does. Default health
thresholds (the reference is kept after 60 s, so the moved check runs from then on); a drift
baseline and window of 3 minutes each (not 24 h) so both the baseline and the window's scoring run
within the measurement, and `reports` once a second (a telemetry tick or page view at most). Frames
are `testkit.health_clips.HealthScene` frames (a textured scene, moving objects, sensor noise), a
bank of 20 per size rendered before timing; 5 detections a frame. OpenCV on the calling thread
only, as in the daemon. CPU time (`time.process_time`), health and drift apart and together.

Usage: python bench/camera_checks.py [--seconds 300] [--fps 15] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]

import numpy as np  # noqa: E402
from testkit.health_clips import HealthScene  # noqa: E402

from agent.config.models import CameraSection, DriftSection  # noqa: E402
from agent.serving.drift_watch import DriftWatch  # noqa: E402
from pipelines.decoding.detections import Detections  # noqa: E402
from pipelines.health_watch import HealthWatch  # noqa: E402
from pipelines.pipeline import use_one_opencv_thread  # noqa: E402
from pipelines.sources.frames import Frame  # noqa: E402

SIZES = {"720p": (1280, 720), "1080p": (1920, 1080)}
LABELS = [f"class{i}" for i in range(80)]
OBJECTS = 5


def detections_bank(width: int, height: int, count: int = 50) -> list[Detections]:
    """`count` sets of `OBJECTS` random boxes within a `width` x `height` frame."""
    rng = np.random.default_rng(1)
    bank = []
    for _ in range(count):
        x, y = rng.uniform(0, width - 200, OBJECTS), rng.uniform(0, height - 200, OBJECTS)
        size = rng.uniform(20, 200, (OBJECTS, 2))
        xyxy = np.stack([x, y, x + size[:, 0], y + size[:, 1]], axis=1).astype(np.float32)
        scores = rng.uniform(0.25, 1.0, OBJECTS).astype(np.float32)
        bank.append(Detections(xyxy, scores, rng.integers(0, 10, OBJECTS).astype(np.int32)))
    return bank


def measure(width: int, height: int, seconds: float, fps: float) -> dict[str, float]:
    """CPU seconds of health, drift and both over `seconds` of a `fps` camera's frames."""
    scene = HealthScene(width, height, seed=1)
    frames = [scene.render(i) for i in range(20)]
    boxes = detections_bank(width, height)
    now = [0.0]
    section = CameraSection(name="cam0", source="synthetic", drift=DriftSection(baseline_h=0.05, window_h=0.05))
    health = HealthWatch("cam0", section.health.thresholds())
    cpu = {"health": 0.0, "drift": 0.0}
    with tempfile.TemporaryDirectory() as state:
        drift = DriftWatch([section], Path(state), lambda: "a" * 64, lambda: LABELS, lambda: now[0])
        for index in range(int(seconds * fps)):
            now[0] = index / fps
            frame = Frame(index, now[0], frames[index % len(frames)])
            start = time.process_time()
            health.offer(frame)
            middle = time.process_time()
            drift.observe("cam0", frame, boxes[index % len(boxes)])
            if index % round(fps) == 0:
                drift.reports()
            end = time.process_time()
            cpu["health"] += middle - start
            cpu["drift"] += end - middle
        scored = drift.reports()[0].score is not None
    if not scored or health.reference is None:
        raise RuntimeError("the run was too short: no drift score or no reference image (raise --seconds)")
    return {name: value / seconds * 100 for name, value in cpu.items()}  # % of a core


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--fps", type=float, default=15.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    use_one_opencv_thread()
    rows = {name: measure(width, height, args.seconds, args.fps) for name, (width, height) in SIZES.items()}
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(), "fps": args.fps, "sizes": rows}))
        return 0
    for name, row in rows.items():
        total = row["health"] + row["drift"]
        print(
            f"{name} at {args.fps:g} FPS: health {row['health']:.3f} % + drift {row['drift']:.3f} % "
            f"= {total:.3f} % of a core per camera (goal: under 2 %)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
