"""One camera's confident detections over a window (`pipelines.detection_rates`), on an injected clock."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoding.detections import Detections
from pipelines.detection_rates import BUCKET_S, WINDOW_S, DetectionRates


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def frame(*found: tuple[int, float]) -> Detections:
    n = len(found)
    return Detections(
        np.zeros((n, 4), np.float32),
        np.array([c for _, c in found], np.float32),
        np.array([k for k, _ in found], np.int32),
    )


def test_only_confident_detections_count_and_per_class() -> None:
    clock = Clock()
    rates = DetectionRates(clock)
    rates.add(frame((0, 0.9), (0, 0.5), (1, 0.49), (2, 0.7)))
    rates.add(frame())
    clock.now += 5
    seen = rates.rates()
    assert seen.frames == 2 and seen.seconds == 5.0
    assert {k: c.count for k, c in seen.classes.items()} == {0: 2, 2: 1}, "0.49 is not confident, 0.5 is"
    assert seen.classes[0].mean_confidence == pytest.approx(0.7)
    assert seen.per_frame() == 1.5 and seen.per_frame(0) == 1.0 and seen.per_frame(1) == 0.0


def test_frames_older_than_the_window_fall_out() -> None:
    clock = Clock()
    rates = DetectionRates(clock)
    rates.add(frame((0, 0.9)))
    clock.now += BUCKET_S
    rates.add(frame((1, 0.9)))
    clock.now += WINDOW_S  # the first bucket is now WINDOW_S + BUCKET_S old, the second WINDOW_S
    seen = rates.rates()
    assert seen.frames == 1 and list(seen.classes) == [1]
    clock.now += 0.001
    assert rates.rates().frames == 0
