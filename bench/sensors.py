#!/usr/bin/env python3
"""Benchmark: one telemetry tick's sensor reading (`Sensors.read`) and governor step per board tree.

Cases, timed in turn in one process (rounds interleave the trees, so a noisy neighbour hits all
alike): every fake board under tests/fakes with ``vcgencmd`` off (files only), the Orin tree
with the governor's step added (a tick's whole cost on a Jetson), and the Pi 5 tree with its
fake ``vcgencmd`` on PATH (three processes a tick, as on a real Pi). Goal: <= 2 ms median on
the Orin tree.

Usage: python bench/sensors.py [--rounds 20] [--reads 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from agent.config.models import GovernorSection
from agent.governor.policy import Governor
from agent.hardware.sensors import Sensors

REPO = Path(__file__).resolve().parent.parent

FAKES = REPO / "tests" / "fakes"
TREES = ("jetson-orin-nano", "jetson-nano", "rpi4", "rpi5", "laptop-battery", "x86-generic")


def cases() -> dict[str, Callable[[], object]]:
    found: dict[str, Callable[[], object]] = {}
    for tree in TREES:
        found[f"{tree} (files)"] = Sensors(FAKES / tree, runner=None).read
    orin, governor = Sensors(FAKES / "jetson-orin-nano", runner=None), Governor(GovernorSection())
    clock = iter(range(10**9))
    found["jetson-orin-nano (files + governor step)"] = lambda: governor.step(orin.read(), float(next(clock)))
    os.environ["PATH"] = f"{FAKES / 'rpi5/usr/bin'}{os.pathsep}{os.environ['PATH']}"
    found["rpi5 (files + fake vcgencmd x3)"] = Sensors(FAKES / "rpi5").read
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--reads", type=int, default=50, help="reads per case per round (vcgencmd cases: a fifth)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    timed = cases()
    samples: dict[str, list[float]] = {name: [] for name in timed}
    for read in timed.values():
        read()  # warm up: imports, first globs
    for _ in range(args.rounds):
        for name, read in timed.items():
            reads = max(1, args.reads // 5) if "vcgencmd" in name else args.reads
            for _ in range(reads):
                start = time.perf_counter()
                read()
                samples[name].append((time.perf_counter() - start) * 1000)
    base = statistics.median(samples["jetson-orin-nano (files)"])
    report = {
        name: {
            "reads": len(values),
            "median_ms": round(statistics.median(values), 3),
            "p95_ms": round(sorted(values)[int(len(values) * 0.95) - 1], 3),
            "vs_orin": round(statistics.median(values) / base, 2),
        }
        for name, values in samples.items()
    }
    if args.json:
        print(json.dumps({"python": platform.python_version(), "cases": report}))
        return 0
    print(f"Python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    print(f"{'case':<44} {'reads':>6} {'median':>10} {'p95':>10} {'x Orin':>7}")
    for name, row in report.items():
        print(
            f"{name:<44} {row['reads']:>6} {row['median_ms']:>7.3f} ms {row['p95_ms']:>7.3f} ms {row['vs_orin']:>7.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
