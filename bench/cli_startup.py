#!/usr/bin/env python3
"""Seconds from process start to exit of ``edge-agent --help`` and ``edge-agent --version``
(issue 36 item 9's goal: under 0.15 s each), for one or more code trees side by side: each round
runs every variant once per command, in rotated order, so a busy machine slows them alike.

Variants are given as in bench/first_detection.py: ``LABEL=PYTHON`` or ``LABEL=PYTHON:TREE``
(that Python with ``PYTHONPATH=TREE``; compile the tree first, ``python -m compileall -q
TREE``). Default: this checkout with this Python.

    python bench/cli_startup.py [--rounds 20] [--variant LABEL=PYTHON[:TREE] ...] [--json]
        [--check-s 0.15]

``--check-s`` exits 1 when the last variant's median of a command is over that many seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from first_detection import rotated  # bench/, this script's folder, is first on the path

REPO = Path(__file__).resolve().parent.parent
COMMANDS = (["--help"], ["--version"])


def run_s(command: list[str], env: dict[str, str]) -> float | None:
    """Wall seconds from start to exit; None when it exits non-zero (``--version`` before it
    existed: a usage error)."""
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd="/")
    elapsed = time.perf_counter() - start
    return elapsed if proc.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=PYTHON[:TREE]")
    parser.add_argument("--json", action="store_true", help="one JSON line: per variant and command, its medians")
    parser.add_argument("--check-s", type=float, help="exit 1 when the last variant's median exceeds this")
    args = parser.parse_args()
    variants = [v.split("=", 1) for v in args.variant] or [["this checkout", f"{sys.executable}:{REPO}"]]
    runs: dict[tuple[str, str], list[float | None]] = {}
    for label, python, env in rotated(variants, args.rounds):
        for words in COMMANDS:
            runs.setdefault((label, words[0]), []).append(run_s([python, "-m", "agent.cli", *words], env))
    report: dict[str, dict[str, float] | None] = {
        f"{label} {command}": (
            None if None in rows else {"median_s": round(statistics.median(rows), 3), "min_s": round(min(rows), 3)}  # type: ignore[type-var]
        )
        for (label, command), rows in runs.items()
    }
    if args.json:
        print(json.dumps(report))
    else:
        for name, row in report.items():
            print(f"{name}: " + (f"median {row['median_s']:.3f} s, fastest {row['min_s']:.3f} s" if row else "fails"))
    last = [row for name, row in report.items() if name.startswith(f"{variants[-1][0]} ")]
    return 1 if any(row is None or row["median_s"] > (args.check_s or float("inf")) for row in last) else 0


if __name__ == "__main__":
    sys.exit(main())
