#!/usr/bin/env python3
"""Benchmark: the CPU of one camera's drift update per inferred frame (issue 40; goal: a tiny
share of a core at the default rate, every frame of a 15 FPS camera inferred).

`agent.serving.drift_watch.DriftWatch.observe` as the daemon calls it from a camera's sink: the labels
looked up, the boxes' area shares, the histograms and the window's bucket, on frames of 720p and
1080p with `--objects` detections each (the frame's pixels are not read, only its size). The
clock moves a fifteenth of a second a frame, so the baseline completes and the window turns as
in service; the baseline is written to a temporary state directory as in service (every
`SAVE_EVERY_S` while captured). Then `report` (each telemetry tick and page view). CPU time
(`time.process_time`); medians and p95 over all.

Usage: python bench/drift_cost.py [--frames 20000] [--objects 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]

import numpy as np  # noqa: E402

from agent.config.models import CameraSection, DriftSection  # noqa: E402
from agent.serving.drift_watch import DriftWatch  # noqa: E402
from pipelines.decoding.detections import Detections  # noqa: E402
from pipelines.sources.frames import Frame  # noqa: E402

SIZES = {"720p": (1280, 720), "1080p": (1920, 1080)}
FPS = 15.0
LABELS = [f"class{i}" for i in range(80)]


def measure(width: int, height: int, frames: int, objects: int) -> tuple[list[float], list[float]]:
    """CPU microseconds of each of `frames` updates, and of `report` every 100 frames."""
    rng = np.random.default_rng(1)
    image = np.zeros((height, width, 3), np.uint8)
    bank = []
    for _ in range(50):
        x, y = rng.uniform(0, width - 200, objects), rng.uniform(0, height - 200, objects)
        size = rng.uniform(20, 200, (objects, 2))
        xyxy = np.stack([x, y, x + size[:, 0], y + size[:, 1]], axis=1).astype(np.float32)
        scores = rng.uniform(0.25, 1.0, objects).astype(np.float32)
        bank.append(Detections(xyxy, scores, rng.integers(0, 10, objects).astype(np.int32)))
    now = [0.0]
    section = CameraSection(name="cam0", source="synthetic", drift=DriftSection(baseline_h=0.1, window_h=0.1))
    updates, reports = [], []
    with tempfile.TemporaryDirectory() as state:
        drift = DriftWatch([section], Path(state), lambda: "a" * 64, lambda: LABELS, lambda: now[0])
        for index in range(frames):
            now[0] += 1 / FPS
            frame = Frame(index, now[0], image)
            start = time.process_time()
            drift.observe("cam0", frame, bank[index % len(bank)])
            updates.append((time.process_time() - start) * 1e6)
            if index % 100 == 99:
                start = time.process_time()
                drift.reports()
                reports.append((time.process_time() - start) * 1e6)
    return updates, reports


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20_000)
    parser.add_argument("--objects", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = {}
    for name, (width, height) in SIZES.items():
        updates, reports = (sorted(x) for x in measure(width, height, args.frames, args.objects))
        rows[name] = {
            "update_median_us": statistics.median(updates),
            "update_p95_us": updates[int(0.95 * len(updates))],
            "report_median_us": statistics.median(reports),
        }
    if args.json:
        print(json.dumps({"machine": platform.processor() or platform.machine(), "sizes": rows}))
        return 0
    for name, row in rows.items():
        share = row["update_median_us"] * FPS / 1e6 * 100
        print(
            f"{name}: update median {row['update_median_us']:.0f} us, p95 {row['update_p95_us']:.0f} us CPU a frame "
            f"({share:.3f} % of a core at {FPS:.0f} FPS); report median {row['report_median_us']:.0f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
