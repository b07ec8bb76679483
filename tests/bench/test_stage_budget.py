"""`bench/stage_budget.py` in a quick form: every stage timed in each scenario, the scenarios in a
rotated order each round, and the runtime's threads inside the scenario's CPUs (the shape of the
report, not its numbers: those are benchmarks, docs/benchmarks.md "Core budgets")."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from testkit import REPO

STAGES = ["capture", "preprocess", "inference", "decode", "tracking", "events", "page_frame", "clip_ring"]


def run_bench(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "bench/stage_budget.py", "--model", "agent/demo/demo_detector.onnx", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=500)


def test_each_scenario_times_every_stage_on_its_own_cpus() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    groups = [str(cpus[0]), f"{cpus[0]},{cpus[1]}"] if len(cpus) >= 2 else [str(cpus[0])]
    proc = run_bench(
        "--cores", *groups, "--sizes", "320x240", "--frames", "8", "--warmup", "2", "--rounds", "2",
        "--set", "spinning=true", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["rows"]
    order = [(row["round"], ",".join(map(str, row["cores"]))) for row in rows]
    expected = [(1, g) for g in groups] + [(2, g) for g in groups[1:] + groups[:1]]
    assert order == expected, "one row per scenario, round 2 starting at the next one"
    for row in rows:
        assert list(row["stages"]) == [*STAGES, "between_calls"]
        assert row["runtime"] == "onnxruntime" and row["config"]["spinning"] is True, "--set reached the runtime"
        assert all(v >= 0 for stage in row["stages"].values() for v in stage.values()), row["stages"]
        assert row["stages"]["inference"]["cpu_ms"] > 0 and row["stages"]["capture"]["wall_ms"] > 0
        assert row["objects_per_frame"] > 0 and row["stages"]["tracking"]["cpu_ms"] > 0
        assert row["events"]["start"] > 0, "the tracked objects' events reach the outbox"
        allowed = set(row["cores"])
        for cpu_list in row["thread_cpu_lists"]:  # "0", "0-1", "1"
            first, _, last = cpu_list.partition("-")
            assert set(range(int(first), int(last or first) + 1)) <= allowed, row["thread_cpu_lists"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cores", "4095"], "--cores names CPUs this process may not use: [4095]"),
        (["--frames", "5", "--warmup", "5"], "--frames (5) must be more than --warmup (5)"),
        (["--set", "spinning"], "--set 'spinning': expected KEY=VALUE"),
        (["--set", "spinnin=false"], "runtimes.onnxruntime refuses {'spinnin': False}"),
    ],
)
def test_bad_arguments_are_named(args: list[str], message: str) -> None:
    proc = run_bench(*args)
    assert proc.returncode != 0 and message in proc.stderr
