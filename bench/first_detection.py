#!/usr/bin/env python3
"""Seconds from process start to `edge-agent detect`'s first output line (issue 28's goal: <= 0.6 s),
for one or more code trees side by side: each round runs every variant once, in rotated order,
so a busy machine slows them alike; medians and ratios to the first variant are printed.

A variant is ``LABEL=PYTHON`` (an installed edge-agent, e.g. a venv made by scripts/install.sh)
or ``LABEL=PYTHON:TREE`` (that Python with ``PYTHONPATH=TREE``: a checkout or ``git archive``
of another commit; compile it first, ``python -m compileall -q TREE``, or every run pays for
compiling its sources). Default: this checkout with this Python.

    python bench/first_detection.py MODEL IMAGE [--rounds 10] [--variant LABEL=PYTHON[:TREE] ...]
        [--json] [--check-s 0.6]

``--check-s`` exits 1 when the last variant's median is over that many seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def first_line_s(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds to the first stdout line, and the process's CPU seconds (user + system)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd="/")
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    elapsed = time.perf_counter() - start
    proc.stdout.read()
    errors = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or not line:
        sys.exit(f"failed ({proc.returncode}): {' '.join(command)}\n{errors[-2000:]}")
    return elapsed, usage.ru_utime + usage.ru_stime


def rotated(variants: list[list[str]], rounds: int) -> Iterator[tuple[str, str, dict[str, str]]]:
    """Every variant (``[LABEL, PYTHON[:TREE]]``) once per round, the order rotated by one each
    round so a busy machine slows them alike: its label, its Python and the environment to run it
    in (``PYTHONPATH=TREE`` when it names a tree, else none)."""
    for round_ in range(rounds):
        shift = round_ % len(variants)
        for label, spec in variants[shift:] + variants[:shift]:
            python, _, tree = spec.partition(":")
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            if tree:
                env["PYTHONPATH"] = tree
            yield label, python, env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("image", type=Path)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=PYTHON[:TREE]")
    parser.add_argument("--json", action="store_true", help="one JSON line: per variant its rounds and medians")
    parser.add_argument("--check-s", type=float, help="exit 1 when the last variant's median exceeds this")
    args = parser.parse_args()
    variants = [v.split("=", 1) for v in args.variant] or [["this checkout", f"{sys.executable}:{REPO}"]]
    detect = ["-m", "agent.cli", "detect", str(args.model.resolve()), str(args.image.resolve()), "--json"]
    runs: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in variants}
    for label, python, env in rotated(variants, args.rounds):
        runs[label].append(first_line_s([python, *detect], env))
    first = statistics.median(wall for wall, _ in runs[variants[0][0]])
    report = {
        label: {
            "wall_s": [round(wall, 3) for wall, _ in rows],
            "median_s": round(statistics.median(wall for wall, _ in rows), 3),
            "ratio": round(statistics.median(wall for wall, _ in rows) / first, 2),
            "cpu_median_s": round(statistics.median(cpu for _, cpu in rows), 3),
        }
        for label, rows in runs.items()
    }
    if args.json:
        print(json.dumps(report))
    else:
        for label, row in report.items():
            walls = " ".join(f"{w:.3f}" for w in row["wall_s"])
            median, ratio, cpu = row["median_s"], row["ratio"], row["cpu_median_s"]
            print(f"{label}: {walls} | median {median:.3f} s ({ratio:.2f}x), CPU {cpu:.3f} s")
    last = report[variants[-1][0]]["median_s"]
    if args.check_s is not None and last > args.check_s:
        print(f"first detection {last:.3f} s is over {args.check_s} s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
