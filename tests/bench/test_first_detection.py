"""`bench/first_detection.py` on the demo detector: two variants of this checkout rotated per
round, their medians and ratio reported, and ``--check-s`` judging the last one (the shape of the
report, not its numbers: those are benchmarks, docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cv2
from testkit import DEMO_MODELS, REPO

from pipelines.sources.synthetic import SyntheticScene


def _run(image: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "bench/first_detection.py", str(DEMO_MODELS / "demo_detector.onnx"), str(image)]
    return subprocess.run([*command, *extra], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_variants_are_timed_side_by_side_and_checked(tmp_path: Path) -> None:
    image = tmp_path / "scene.png"
    cv2.imwrite(str(image), SyntheticScene(seed=3).render(0)[0])
    here = f"{sys.executable}:{REPO}"
    proc = _run(image, "--rounds", "2", "--variant", f"a={here}", "--variant", f"b={here}", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert list(report) == ["a", "b"] and report["a"]["ratio"] == 1.0
    for row in report.values():
        assert len(row["wall_s"]) == 2 and 0 < min(row["wall_s"]) <= row["median_s"] <= max(row["wall_s"])
        assert row["cpu_median_s"] > 0
    assert abs(report["b"]["ratio"] - report["b"]["median_s"] / report["a"]["median_s"]) <= 0.011
    over = _run(image, "--rounds", "1", "--check-s", "0.001")
    assert over.returncode == 1 and "is over 0.001 s" in over.stderr
