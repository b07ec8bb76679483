"""`bench/camera_memory.py` in its quick form: a row per resolution with the per-camera figures,
and ``--check`` judging the 1080p one against the limit (the shape of the report, not its numbers:
those are benchmarks, docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from testkit import REPO


@pytest.mark.long(seconds=40)
def test_the_quick_run_reports_each_resolution_and_checks_1080p() -> None:
    command = [sys.executable, "bench/camera_memory.py", "--quick", "--json", "--check", "--limit-mb", "1000"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert [row["resolution"] for row in report["rows"]] == ["640x480", "1920x1080"]
    for row in report["rows"]:
        assert row["rss_2_mb"] > 0 and row["rss_1_mb"] > 0
        extra, scene = row["per_extra_camera_mb"], row["synthetic_scene_mb"]
        assert abs(extra - (row["rss_2_mb"] - row["rss_1_mb"])) <= 0.11, "one extra camera: the difference"
        assert abs(row["per_extra_camera_less_scene_mb"] - (extra - scene)) <= 0.11
    hd = report["rows"][1]
    assert hd["frame_mb"] == 6.22 and hd["synthetic_scene_mb"] == 31.1, "1920x1080 BGR: 6.2 MB a frame, 5 held"
    assert "ok: " in proc.stderr and "per extra camera at 1920x1080 (limit 1000.0 MB)" in proc.stderr
