"""`agent.governor.levels`: the governor's values are checked at construction and accept their edges."""

from __future__ import annotations

import re
from typing import Any

import pytest

from agent.governor.levels import Actions, TemperatureThresholds, ThermalLevel


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: TemperatureThresholds(70, 60, 80, 3, ("config",) * 3),
            "expected warm_c < hot_c < critical_c, got 70, 60, 80",
        ),
        (lambda: Actions(fps_cap=0), "Actions.fps_cap: expected a positive number or None, got 0"),
        (lambda: Actions(fan_percent=120), "Actions.fan_percent: expected 0..100 or None, got 120"),
        (
            lambda: TemperatureThresholds(70, 70, 90, 3, ("config",) * 3),
            "expected warm_c < hot_c < critical_c, got 70, 70, 90",
        ),
        (
            lambda: TemperatureThresholds(60, 90, 90, 3, ("config",) * 3),
            "expected warm_c < hot_c < critical_c, got 60, 90, 90",
        ),
        (
            lambda: TemperatureThresholds(60, 70, 90, -0.5, ("config",) * 3),
            "TemperatureThresholds.hysteresis_c: expected >= 0, got -0.5",
        ),
        (lambda: Actions(fan_percent=100.5), "Actions.fan_percent: expected 0..100 or None, got 100.5"),
        (lambda: Actions(fan_percent=-1), "Actions.fan_percent: expected 0..100 or None, got -1"),
    ],
)
def test_governor_values_are_checked_at_construction(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        build()


def test_levels_accept_their_edges() -> None:
    assert TemperatureThresholds(60, 70, 90, 0, ("config",) * 3).hysteresis_c == 0
    assert Actions(fps_cap=0.5, fan_percent=100).fan_percent == 100
    assert Actions(fan_percent=0).fan_percent == 0
    assert TemperatureThresholds(60, 70, 90, 0, ("config",) * 3).start_of(ThermalLevel.NORMAL) == float("-inf")
