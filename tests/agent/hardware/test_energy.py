"""`agent.hardware.energy`: power integrated by the trapezoid rule over an injected clock, gaps
left uncounted, a clock that stalls or goes back counting nothing, watt-hours per hour."""

from __future__ import annotations

import math

import pytest

from agent.hardware.energy import Energy, EnergyMeter


def meter_of(readings: list[tuple[float, float | None]]) -> EnergyMeter:
    meter = EnergyMeter()
    for now, power_w in readings:
        meter.add(power_w, now)
    return meter


@pytest.mark.parametrize(
    ("readings", "joules", "measured_s"),
    [
        # (now s, power W): each interval (p0 + p1) / 2 x (t1 - t0)
        ([(0.0, 10.0), (10.0, 20.0)], 150.0, 10.0),  # not 100 (left end) nor 200 (right end)
        ([(0.0, 10.0), (10.0, 20.0), (30.0, 20.0)], 550.0, 30.0),  # every interval counted, unequal ones too
        ([(0.0, 5.0), (10.0, None), (20.0, 5.0), (30.0, 5.0)], 50.0, 10.0),  # a gap: no guess across it
        ([(0.0, 5.0), (10.0, -1.0), (20.0, 5.0), (25.0, 5.0)], 25.0, 5.0),  # a negative reading is a gap
        ([(0.0, 5.0), (10.0, math.nan), (20.0, 5.0), (21.0, 5.0)], 5.0, 1.0),
        ([(0.0, 4.0), (10.0, 4.0), (10.0, 8.0), (20.0, 8.0)], 40.0 + 80.0, 20.0),  # the same moment: newer power
        ([(0.0, 4.0), (10.0, 4.0), (5.0, 100.0), (20.0, 4.0)], 40.0 + 40.0, 20.0),  # a clock gone back: ignored
    ],
)
def test_power_is_integrated_by_the_trapezoid_rule(
    readings: list[tuple[float, float | None]], joules: float, measured_s: float
) -> None:
    energy = meter_of(readings).energy
    assert energy is not None
    assert (energy.joules, energy.measured_s) == pytest.approx((joules, measured_s))


@pytest.mark.parametrize("readings", [[], [(0.0, 5.0)], [(0.0, None), (10.0, None)], [(0.0, 5.0), (10.0, None)]])
def test_no_energy_until_an_interval_had_both_ends_measured(readings: list[tuple[float, float | None]]) -> None:
    assert meter_of(readings).energy is None


def test_watt_hours_and_watt_hours_per_hour() -> None:
    energy = meter_of([(0.0, 6.0), (1800.0, 6.0)]).energy  # 6 W for half an hour
    assert energy is not None and energy.joules == 10800.0
    assert (energy.wh, energy.wh_per_h) == (3.0, 6.0)
    assert Energy(0.0, 0.0).wh_per_h is None
