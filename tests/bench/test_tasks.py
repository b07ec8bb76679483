"""`bench/tasks.py`: every step reported, for the synthetic 640 outputs and the demo models, with
medians, ratios to the box decode and the objects each step handled (not their timings)."""

from __future__ import annotations

import json
import subprocess
import sys

from testkit import REPO

STEPS = {"detect", "seg-decode", "seg-masks", "seg-outlines", "pose-decode", "obb-decode", "obb-nms"}


def test_the_bench_reports_every_step() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/tasks.py", "--frames", "2", "--demo", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["frames"] == 2 and report["machine"]
    for kind in ("synthetic-640", "demo-320"):
        steps = report[kind]
        assert set(steps) == STEPS, kind
        assert steps["detect"]["ratio_to_detect"] == 1.0
        for name, r in steps.items():
            assert r["median_ms"] > 0 and r["ratio_to_detect"] > 0, (kind, name)
        assert steps["seg-masks"]["objects"] == steps["seg-decode"]["objects"] > 0, "a mask for every kept object"


def test_a_bad_frame_count_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/tasks.py", "--frames", "0"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert proc.returncode == 2 and "--frames must be at least 1" in proc.stderr
