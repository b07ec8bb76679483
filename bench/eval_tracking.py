"""Tracking accuracy on held-out synthetic clips: the demo detector, then `ByteTracker`, scored
with CLEAR-MOT and identity metrics by py-motmetrics (a dev dependency).

Each clip is a seeded `pipelines.sources.tracking_scene.TrackingScene` (640x480, shapes entering, crossing
and leaving, passing behind each other); shapes less than half visible are ignored
(`pipelines.measure.evaluate.tracking_frame`). Prints one JSON line per clip and one for all.

    .venv/bin/python bench/eval_tracking.py --clips 4 --frames 300
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from testkit.tracking import METRICS, evaluate_tracking


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, default=Path(__file__).resolve().parents[1] / "agent/demo/demo_detector.onnx"
    )
    parser.add_argument("--clips", type=int, default=4)
    parser.add_argument("--frames", type=int, default=300)
    args = parser.parse_args()
    started = time.perf_counter()
    summary = evaluate_tracking(args.model, clips=args.clips, frames=args.frames)
    for name, row in summary.items():
        print(json.dumps({"clip": name, **{k: row[k] for k in METRICS}}))
    print(json.dumps({"seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
