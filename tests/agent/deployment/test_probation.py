"""`agent.deployment.probation.ProbationJudge`: is the new version serving as well as the old?"""

from __future__ import annotations

import pytest

from agent.deployment.probation import PASSED, ProbationJudge
from pipelines.latency import Percentiles
from pipelines.pipeline import PipelineStats
from pipelines.sources.frames import SourceState


def stats(
    name: str,
    frames: int,
    errors: int = 0,
    fps: float = 10.0,
    state: str = "running",
    paused: bool = False,
    max_fps: float | None = None,
    bad: int = 0,
):
    return PipelineStats(
        name=name,
        source="synthetic",
        fps=fps,
        frames=frames,
        dropped=0,
        errors=errors,
        swaps=0,
        paused=paused,
        max_fps=max_fps,
        workers=1,
        latency_ms={"total": Percentiles(1.0, 2.0)},
        source_status=SourceState(state, None, 0),  # type: ignore[arg-type]
        runtime="onnxruntime",
        model="m.onnx",
        bad_outputs=bad,
        bad_output="output 0 (1, 84, 8400) is all NaN or infinite" if bad else None,
    )


# (before the swap, observations as (seconds since the swap, stats), expected verdict or words in it)
PROBATION_CASES = {
    "serves as well": ([stats("a", 100)], [(5, [stats("a", 150)]), (10, [stats("a", 200, fps=9.0)])], PASSED),
    "frames keep failing": ([stats("a", 100)], [(2, [stats("a", 100, errors=3)])], "3 frames failed"),
    "no frame at all": ([stats("a", 100)], [(10, [stats("a", 100)])], "inferred no frame"),
    "half the fps": (
        [stats("a", 100, fps=10.0)],
        [(5, [stats("a", 130, fps=4.0)]), (10, [stats("a", 160, fps=4.5)])],
        "4.2 FPS, below 0.5 x the 10.0 FPS",
    ),
    "paused cameras are not compared": (
        [stats("a", 100, fps=10.0)],
        [(6, [stats("a", 120, fps=0.5, paused=True)]), (10, [stats("a", 121, fps=0.5, paused=True)])],
        PASSED,
    ),
    "capped below the old fps": (  # the governor's cap (4) is the baseline, not the old 10 FPS
        [stats("a", 100, fps=10.0)],
        [(5, [stats("a", 120, fps=3.9, max_fps=4.0)]), (10, [stats("a", 140, fps=3.8, max_fps=4.0)])],
        PASSED,
    ),
    "slow under the cap": (
        [stats("a", 100, fps=10.0)],
        [(5, [stats("a", 110, fps=1.5, max_fps=4.0)]), (10, [stats("a", 118, fps=1.5, max_fps=4.0)])],
        "1.5 FPS, below 0.5 x the 4.0 FPS",
    ),
    "capped above the old fps": (  # a cap the old version never reached changes nothing
        [stats("a", 100, fps=10.0)],
        [(5, [stats("a", 120, fps=4.0, max_fps=15.0)]), (10, [stats("a", 140, fps=4.0, max_fps=15.0)])],
        "4.0 FPS, below 0.5 x the 10.0 FPS",
    ),
    # a deployment that moves a camera between runtimes restarts its pipeline: counters from 0
    "a camera restarted by the swap": (
        [stats("a", 600)],
        [(1, [stats("a", 8)]), (5, [stats("a", 48)]), (10, [stats("a", 98)])],
        PASSED,
    ),
    "a restarted camera that infers nothing": (
        [stats("a", 600)],
        [(1, [stats("a", 0)]), (10, [stats("a", 0)])],
        "inferred no frame",
    ),
    "a restarted camera whose frames keep failing": (
        [stats("a", 600, errors=5)],
        [(2, [stats("a", 0, errors=3)])],
        "3 frames failed",
    ),
    # a runtime (a plugin) whose output is all NaN or the wrong shape on every frame
    "unusable output on every frame": (
        [stats("a", 100)],
        [(2, [stats("a", 100, errors=3, bad=3)])],
        "output was unusable on 3 frames of the new version and none succeeded (output 0 (1, 84, 8400) is all NaN",
    ),
    "unusable output on most frames": (
        [stats("a", 100, errors=1, bad=1)],
        [(5, [stats("a", 105, errors=7, bad=7)]), (10, [stats("a", 110, errors=13, bad=13)])],
        "output was unusable on 12 frames of the new version, more than the 10 it inferred",
    ),
    "unusable output on a few frames": (
        [stats("a", 100)],
        [(5, [stats("a", 150, errors=2, bad=2)]), (10, [stats("a", 200, errors=4, bad=4)])],
        PASSED,
    ),
    "a camera the new version started": ([], [(5, [stats("b", 40)]), (10, [stats("b", 90)])], PASSED),
    "a lost camera is not the model's fault": (
        [stats("a", 100)],
        [(10, [stats("a", 100, fps=0.0, state="reconnecting")])],
        PASSED,
    ),
}


@pytest.mark.parametrize("case", list(PROBATION_CASES))
def test_probation_judge(case: str) -> None:
    before, observations, expected = PROBATION_CASES[case]
    judge = ProbationJudge(before, start=100.0, duration_s=10, min_fps_ratio=0.5)
    verdicts = [judge.observe(observed, 100.0 + at) for at, observed in observations]
    assert all(v is None for v in verdicts[:-1]), verdicts
    assert verdicts[-1] is not None and expected in verdicts[-1], verdicts
