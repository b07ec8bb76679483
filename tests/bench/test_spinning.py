"""`bench/spinning.py` in a quick form: both settings run in the balanced order and reach the
runtime, and the report has each model's medians side by side (the shape, not the numbers:
docs/benchmarks.md "Core budgets")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from testkit import REPO


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "bench/spinning.py", "--models", "agent/demo/demo_detector.onnx", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)


def test_both_settings_side_by_side_in_the_balanced_order() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from spinning import order
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert order(4) == [True, False, False, True, True, False, False, True]
    core = str(min(os.sched_getaffinity(0)))
    proc = run_bench("--cores", core, "--size", "320x240", "--frames", "4", "--warmup", "1", "--runs", "1", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = json.loads(proc.stdout.strip().splitlines()[-1])["results"]
    assert result["model"] == "demo_detector.onnx"
    for name in ("on", "off"):
        assert result[name]["frame_cpu_ms"] > 0 and result[name]["inference_wall_ms"] > 0
    assert result["frame_cpu_off_over_on"] == round(result["off"]["frame_cpu_ms"] / result["on"]["frame_cpu_ms"], 3)


def test_a_missing_model_is_named() -> None:
    proc = run_bench("--models", "nowhere.onnx")
    assert proc.returncode != 0 and "model not found: nowhere.onnx" in proc.stderr
