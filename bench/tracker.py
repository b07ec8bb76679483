"""Benchmark: the tracker's cost per frame (`pipelines.tracking.tracker.ByteTracker.update`) and the
whole per-camera analytics step (tracker + 2 lines + 1 zone), for N objects a frame.

Objects move on straight lines with a few pixels of box jitter, a tenth of the detections are
dropped (misses) and some are low-score, so every association round runs. Prints medians and
95th percentiles in ms per frame (docs/benchmarks.md).

    .venv/bin/python bench/tracker.py --objects 20 --frames 2000
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame
from pipelines.tracking.analytics import SceneAnalytics
from pipelines.tracking.tracker import ByteTracker
from pipelines.tracking.zones import LineSpec, ZoneSpec


def frames(objects: int, count: int, seed: int = 0) -> list[Detections]:
    """`count` frames of `objects` boxes bouncing in 1280x720, jittered, 10 % missed."""
    rng = np.random.default_rng(seed)
    start = rng.uniform([0, 0], [1200, 640], (objects, 2))
    velocity = rng.uniform(-6, 6, (objects, 2))
    size = rng.uniform(30, 90, (objects, 2))
    out = []
    for t in range(count):
        centre = np.abs((start + velocity * t) % 2400 - 1200) + 40
        centre[:, 1] = np.abs((start[:, 1] + velocity[:, 1] * t) % 1280 - 640) + 40
        xyxy = np.concatenate([centre - size / 2, centre + size / 2], axis=1) + rng.normal(0, 1.5, (objects, 4))
        score = np.where(rng.random(objects) < 0.15, rng.uniform(0.15, 0.45, objects), rng.uniform(0.6, 0.95, objects))
        keep = rng.random(objects) > 0.1
        out.append(Detections.from_arrays(xyxy[keep], score[keep], rng.integers(0, 3, objects)[keep]))
    return out


def measure(step: object, clip: list[Detections]) -> list[float]:
    times = []
    for i, detections in enumerate(clip):
        begin = time.perf_counter()
        step(i, detections)  # type: ignore[operator]
        times.append((time.perf_counter() - begin) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20)
    parser.add_argument("--frames", type=int, default=2000)
    args = parser.parse_args()
    clip = frames(args.objects, args.frames)
    tracker = ByteTracker()
    image = np.zeros((720, 1280, 3), np.uint8)
    analytics = SceneAnalytics(
        "bench",
        lines=[LineSpec("a", (0, 360), (1280, 360)), LineSpec("b", (640, 0), (640, 720))],
        zones=[ZoneSpec("z", ((100, 100), (600, 100), (600, 600), (100, 600)))],
    )
    results = {}
    for name, step in (
        ("tracker", lambda i, d: tracker.update(d)),
        ("analytics", lambda i, d: analytics.update(Frame(i, i / 30, image), d)),
    ):
        times = measure(step, clip)[50:]  # past the first tracks' start
        results[name] = {
            "median_ms": round(float(np.median(times)), 3),
            "p95_ms": round(float(np.percentile(times, 95)), 3),
        }
    print(json.dumps({"objects": args.objects, "frames": args.frames, **results}))


if __name__ == "__main__":
    main()
