#!/usr/bin/env python3
"""ONNX Runtime session options side by side: memory pattern on/off, one call or two at once.

Each variant runs in its own process (so peak RSS is its own), in an order reversed every
round; FPS is inference alone on one pre-made tensor. Prints medians and, per variant, the
median of its per-round ratio to the first variant (ORT's defaults).

    python bench/ort_options.py MODEL.onnx [--rounds 5] [--runs 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

VARIANT = """
import json, resource, sys, threading, time
import numpy as np, onnxruntime as ort
path, runs, calls, pattern = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "on"
options = ort.SessionOptions()
options.enable_mem_pattern = pattern
if calls > 1:
    options.intra_op_num_threads = 1
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
spec = session.get_inputs()[0]
x = np.random.default_rng(0).random([d if isinstance(d, int) else 1 for d in spec.shape], dtype=np.float32)
def loop(n):
    for _ in range(n):
        session.run(None, {spec.name: x})
loop(3)
threads = [threading.Thread(target=loop, args=(runs // calls,)) for _ in range(calls)]
start = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join()
fps = runs // calls * calls / (time.perf_counter() - start)
print(json.dumps({"fps": fps, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

VARIANTS = {  # name: (calls at once, memory pattern)
    "default": (1, "on"),
    "no_pattern": (1, "off"),
    "2x1": (2, "on"),
    "2x1_no_pattern": (2, "off"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200, help="inferences per variant per round")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    order = list(VARIANTS)
    for round_ in range(args.rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            calls, pattern = VARIANTS[name]
            cmd = [sys.executable, "-c", VARIANT, args.model, str(args.runs), str(calls), pattern]
            results[name].append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    summary = {
        name: {
            "fps": round(statistics.median(r["fps"] for r in runs), 2),
            "vs_default_paired": round(
                statistics.median(r["fps"] / d["fps"] for r, d in zip(runs, results["default"], strict=True)), 3
            ),
            "rss_mb": round(statistics.median(r["rss_mb"] for r in runs), 1),
            "all_fps": [round(r["fps"], 2) for r in runs],
        }
        for name, runs in results.items()
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
