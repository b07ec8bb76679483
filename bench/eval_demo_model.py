#!/usr/bin/env python3
"""Precision and recall at IoU 0.5 of every demo detector artifact (`demo_detector*`; the task
models beside it are checked by scripts/check_ultralytics_tasks.py) on its runtime, on the
held-out synthetic clip (scene seeds never used in training).

    python bench/eval_demo_model.py [--models agent/demo] [--frames 50] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipelines.decoding.detector import Detector
from pipelines.measure.evaluate import evaluate_on_synthetic
from runtimes.registry import load_runtime

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=REPO / "agent" / "demo")
    parser.add_argument("--frames", type=int, default=50, help="frames per held-out scene (4 scenes)")
    parser.add_argument("--conf", type=float, default=0.25)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    for path in sorted([*args.models.glob("demo_detector*.onnx"), *args.models.glob("demo_detector*.tflite")]):
        runtime_name = "onnxruntime" if path.suffix == ".onnx" else "litert"
        with load_runtime(runtime_name, path) as runtime:
            detector = Detector(runtime, conf=args.conf)
            counts = evaluate_on_synthetic(detector.detect, frames_per_scene=args.frames)
        results[path.name] = {
            "runtime": runtime_name,
            "precision": round(counts.precision, 4),
            "recall": round(counts.recall, 4),
            "tp": counts.true_positives,
            "fp": counts.false_positives,
            "fn": counts.false_negatives,
        }
    if args.json:
        print(json.dumps(results))
        return
    for name, r in results.items():
        print(
            f"{name:<30} {r['runtime']:<12} precision {r['precision']:.3f}  recall {r['recall']:.3f}  "
            f"(tp {r['tp']}, fp {r['fp']}, fn {r['fn']})"
        )


if __name__ == "__main__":
    main()
