"""`pipelines.sources.scene_source`: the synthetic scene as a camera, bounded or paced to its FPS."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.sources.scene_source import SyntheticSource


def test_synthetic_source_bounded_and_with_truth() -> None:
    source = SyntheticSource(frames=3)
    source.open()
    frames = [source.read() for _ in range(4)]
    assert frames[3] is None
    assert all(f is not None and f.truth is not None for f in frames[:3])
    assert not source.live and SyntheticSource(fps=30).live


class FakeClock:
    """Time that passes only when the source sleeps (or when a test says so)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_paced_synthetic_source_sleeps_to_its_fps() -> None:
    clock = FakeClock()
    source = SyntheticSource(fps=10, frames=6, sleep=clock.sleep, clock=clock)
    source.open()
    stamps = [frame.timestamp for frame in (source.read() for _ in range(3)) if frame]
    assert clock.slept == pytest.approx([0.1, 0.1])
    assert np.diff(stamps) == pytest.approx([0.1, 0.1])
    # a slow consumer (0.25 s late): two frames without sleeping, then back on the 0.1 s grid
    clock.now += 0.25
    source.read()
    source.read()
    assert clock.slept == pytest.approx([0.1, 0.1])
    source.read()
    assert clock.slept == pytest.approx([0.1, 0.1, 0.05])
