"""`bench/motion_cost.py` on short, small clips: a row per clip and size, the gated run inferring
fewer frames of the still clip, its recall of the ungated run's events (the shape of the report,
not its numbers: those are benchmarks, docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from testkit import REPO


def test_a_short_run_reports_each_clip_and_the_frames_the_gate_left() -> None:
    command = [sys.executable, "bench/motion_cost.py", "--seconds", "6", "--rounds", "1", "--sizes", "640x360"]
    proc = subprocess.run([*command, "--json"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    rows = {row["clip"]: row for row in report["rows"]}
    assert sorted(rows) == ["busy", "still"] and all(r["size"] == "640x360" for r in rows.values())
    still = rows["still"]
    assert still["frames"] == 60 and 0 < still["inferred"] < still["frames"], still
    assert still["cpu_s_per_min"] > 0 and still["gated_cpu_s_per_min"] > 0
    assert still["ratio"] == round(still["ratio"], 3) and 0 <= still["event_recall"] <= 1
    assert report["keepalive_fps"] == 1.0 and report["model"] == "demo_detector.onnx"  # the gate's default
    before, after = report["load_avg_1min"]  # a shared machine: what else ran is part of the numbers
    assert before >= 0 and after >= 0
