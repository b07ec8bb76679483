"""`bench/eval_demo_model.py`: every demo detector artifact above 0.9 precision and recall."""

from __future__ import annotations

import json
import subprocess
import sys

from testkit import REPO


def test_eval_script_reports_every_artifact_above_0_9() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/eval_demo_model.py", "--frames", "25", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    assert set(results) == {
        "demo_detector.onnx",
        "demo_detector_dynamic.onnx",
        "demo_detector_int8_qdq.onnx",
        "demo_detector_fp32.tflite",
        "demo_detector_int8.tflite",
    }
    for name, r in results.items():
        assert r["precision"] >= 0.9 and r["recall"] >= 0.9, (name, r)
