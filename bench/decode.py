#!/usr/bin/env python3
"""Benchmark: YOLOv8 decode + class-aware NMS of one (1, 84, 8400) output at conf 0.25.

Outputs timed:
- ``synthetic``: 30 objects, each with 40 overlapping candidate anchors above the threshold,
  every other anchor with class scores below it (sigmoid-like noise in 0..0.2);
- ``coco-<photo>``: the real output of ``yolov8n_int8_640.onnx`` on scikit-image photos, when
  ``../shared/models`` is present.

The plausibility guard (`pipelines.decoding.plausibility.problems`, run on every decoded frame) is timed
side by side: decode + guard + NMS against decode + NMS, interleaved run by run.

Usage: python bench/decode.py [--repeat 2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from pipelines.decoding.decoders import decode_yolov8
from pipelines.decoding.nms import class_aware_nms
from pipelines.decoding.plausibility import problems

REPO = Path(__file__).resolve().parent.parent


def synthetic_output(objects: int = 30, per_object: int = 40, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.zeros((84, 8400), np.float32)
    out[:4] = rng.uniform(0, 640, (4, 8400))
    out[4:] = rng.uniform(0, 0.2, (80, 8400))
    anchors = rng.choice(8400, objects * per_object, replace=False).reshape(objects, per_object)
    for obj in range(objects):
        cx, cy = rng.uniform(50, 590, 2)
        w, h = rng.uniform(20, 200, 2)
        cls = int(rng.integers(80))
        idx = anchors[obj]
        jitter = rng.normal(0, 3, (4, per_object))
        out[:4, idx] = np.array([[cx], [cy], [w], [h]]) + jitter
        out[4 + cls, idx] = rng.uniform(0.3, 0.95, per_object)
    return out[None]


def coco_outputs() -> dict[str, np.ndarray]:
    models = REPO.parent / "shared" / "models"
    if not (models / "yolov8n_int8_640.onnx").is_file():
        return {}
    from skimage import data

    from pipelines.decoding.detector import Detector
    from pipelines.decoding.preprocess import preprocess
    from runtimes.ort_backend import OnnxRuntimeBackend

    runtime = OnnxRuntimeBackend(models / "yolov8n_int8_640.onnx")
    detector = Detector(runtime)
    outputs = {}
    for name in ("astronaut", "coffee"):
        tensor, _ = preprocess(getattr(data, name)()[..., ::-1].copy(), detector.preprocess_config)
        outputs[f"coco-{name}"] = runtime.infer([tensor])[0]
    return outputs


def time_one(output: np.ndarray, repeat: int) -> dict[str, float]:
    times = []
    kept = 0
    for _ in range(repeat):
        start = time.perf_counter()
        candidates = decode_yolov8([output], (640, 640), 0.25)
        kept = len(class_aware_nms(candidates, 0.45, 300))
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {
        "candidates": len(decode_yolov8([output], (640, 640), 0.25)),
        "kept": kept,
        "median_ms": round(statistics.median(times), 3),
        "p95_ms": round(times[int(0.95 * len(times))], 3),
    }


def time_guard(output: np.ndarray, repeat: int) -> dict[str, float]:
    """Medians of decode + NMS without and with the guard, the two interleaved run by run."""
    without, with_guard = [], []
    for _ in range(repeat):
        for times, guard in ((without, False), (with_guard, True)):
            start = time.perf_counter()
            candidates = decode_yolov8([output], (640, 640), 0.25)
            if guard and problems(candidates, (640, 640)):
                raise SystemExit("the guard refused a plausible output")
            class_aware_nms(candidates, 0.45, 300)
            times.append((time.perf_counter() - start) * 1000)
    a, b = statistics.median(without), statistics.median(with_guard)
    return {"without_ms": round(a, 3), "with_guard_ms": round(b, 3), "ratio": round(b / a, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = {"synthetic": synthetic_output(), **coco_outputs()}
    results = {name: time_one(out, args.repeat) for name, out in cases.items()}
    guard = {name: time_guard(out, args.repeat) for name, out in cases.items()}
    report = {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "numpy": np.__version__,
        "repeat": args.repeat,
        "results": results,
        "guard": guard,
    }
    if args.json:
        print(json.dumps(report))
        return
    print(f"decode + NMS of (1, 84, 8400) at conf 0.25, {args.repeat} runs each, numpy {np.__version__}")
    for name, r in results.items():
        print(
            f"  {name:<16} candidates {r['candidates']:>5}  kept {r['kept']:>3}  "
            f"median {r['median_ms']:.3f} ms  p95 {r['p95_ms']:.3f} ms"
        )
    print("plausibility guard: decode + NMS without / with it (medians, interleaved)")
    for name, g in guard.items():
        print(f"  {name:<16} {g['without_ms']:.3f} ms / {g['with_guard_ms']:.3f} ms  ratio {g['ratio']:.3f}")


if __name__ == "__main__":
    main()
