#!/usr/bin/env python3
"""ONNX Runtime's spin-waiting on and off, side by side in one run (docs/benchmarks.md, "Core
budgets"; `runtimes.onnxruntime.spinning`).

Each run is one `bench/stage_budget.py` scenario (its child process, pinned to `--cores`, the
daemon's per-frame work on its clip, one thread) with ``spinning`` true or false; the settings
alternate on, off, off, on, ... (`--runs` of each), so a change in the machine's load falls on
both alike. Per model and setting it prints the median over the runs of: inference wall ms
(the latency a frame sees), inference CPU ms (every ONNX Runtime thread), the CPU between calls
(spinning threads) and the frame's CPU (every stage's mean plus between calls), with off's
frame CPU over on's.

    .venv/bin/python bench/spinning.py [--models M ...] [--cores 0,1] [--size 1280x720] [--runs 4] [--json]

The default models: the demo detector and, where present, ../shared/models/yolov8n_int8_640.onnx.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from stage_budget import STAGES, run_child, write_clip  # noqa: E402

SHARED_YOLO = REPO.parent / "shared" / "models" / "yolov8n_int8_640.onnx"


def order(runs: int) -> list[bool]:
    """on, off, off, on, on, off, ...: `runs` of each, each pair balanced."""
    pairs = [(True, False) if i % 2 == 0 else (False, True) for i in range(runs)]
    return [spinning for pair in pairs for spinning in pair]


def frame_cpu_ms(row: dict[str, Any]) -> float:
    stages = row["stages"]
    return sum(stages[s]["cpu_mean_ms"] for s in (*STAGES, "between_calls") if s in stages)


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    def median(values: list[float]) -> float:
        return round(statistics.median(values), 2)

    return {
        "inference_wall_ms": median([r["stages"]["inference"]["wall_ms"] for r in rows]),
        "inference_wall_ms_min": round(min(r["stages"]["inference"]["wall_ms"] for r in rows), 2),
        "inference_wall_ms_max": round(max(r["stages"]["inference"]["wall_ms"] for r in rows), 2),
        "inference_cpu_ms": median([r["stages"]["inference"]["cpu_ms"] for r in rows]),
        "between_calls_cpu_ms": median([r["stages"]["between_calls"]["cpu_mean_ms"] for r in rows]),
        "frame_cpu_ms": median([frame_cpu_ms(r) for r in rows]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = [REPO / "agent" / "demo" / "demo_detector.onnx", *([SHARED_YOLO] if SHARED_YOLO.is_file() else [])]
    parser.add_argument("--models", nargs="+", type=Path, default=defaults)
    parser.add_argument("--cores", default="0,1", help="one CPU set, as taskset -c takes it")
    parser.add_argument("--size", default="1280x720")
    parser.add_argument("--frames", type=int, default=45)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=4, help="runs of each setting per model")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cores = [int(c) for c in args.cores.split(",")]
    if missing := sorted(set(cores) - os.sched_getaffinity(0)):
        raise SystemExit(f"--cores names CPUs this process may not use: {missing}")
    if args.frames <= args.warmup:
        raise SystemExit(f"--frames ({args.frames}) must be more than --warmup ({args.warmup})")
    for model in args.models:
        if not model.is_file():
            raise SystemExit(f"model not found: {model}")
    width, height = (int(v) for v in args.size.split("x"))
    clip = write_clip(Path(tempfile.mkdtemp(prefix="spinning-")) / "clip.avi", (width, height), args.frames)
    load_before = os.getloadavg()
    results: list[dict[str, Any]] = []
    for model in args.models:
        rows: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
        for spinning in order(args.runs):
            spec = {
                "cores": cores, "size": (width, height), "clip": str(clip), "model": str(model),
                "runtime": "onnxruntime", "settings": {"spinning": spinning}, "frames": args.frames,
                "warmup": args.warmup, "stages": STAGES,
            }  # fmt: skip
            row = run_child(spec)
            rows[spinning].append(row)
            if not args.json:
                inference = row["stages"]["inference"]
                print(
                    f"{model.name} spinning={str(spinning).lower():5} inference {inference['wall_ms']:.1f} ms wall "
                    f"{inference['cpu_ms']:.1f} ms CPU, frame CPU {frame_cpu_ms(row):.1f} ms",
                    flush=True,
                )
        on, off = summary(rows[True]), summary(rows[False])
        results.append(
            {
                "model": model.name,
                "on": on,
                "off": off,
                "frame_cpu_off_over_on": round(off["frame_cpu_ms"] / on["frame_cpu_ms"], 3),
            }
        )
    machine = {"cores": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()}
    if args.json:
        print(
            json.dumps({"cores": cores, "size": args.size, "runs": args.runs, "machine": machine, "results": results})
        )
        return
    loads = f"load {load_before[0]:.1f} -> {machine['load_after'][0]:.1f}"  # type: ignore[index]
    print(f"\nmedians over {args.runs} runs each, cores {args.cores}, {args.size}; {loads}")
    for result in results:
        for name in ("on", "off"):
            s = result[name]
            print(
                f"{result['model']:28} spinning {name:3}: inference {s['inference_wall_ms']} ms wall "
                f"({s['inference_wall_ms_min']} to {s['inference_wall_ms_max']}), {s['inference_cpu_ms']} ms CPU, "
                f"between calls {s['between_calls_cpu_ms']} ms, frame CPU {s['frame_cpu_ms']} ms"
            )
        print(f"{result['model']:28} frame CPU off / on: {result['frame_cpu_off_over_on']}x")


if __name__ == "__main__":
    main()
