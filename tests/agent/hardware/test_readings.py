"""`agent.hardware.readings`: readings are checked at construction."""

from __future__ import annotations

from typing import Any

import pytest

from agent.hardware.readings import Battery, SensorReadings, ThermalZone, Throttled


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ThermalZone("cpu", 500.0), "ThermalZone.temp_c: expected a number within -60.0..200.0, got 500.0"),
        (lambda: Battery(101.0, None, None, None, None, "x"), "Battery.percent"),
        (lambda: SensorReadings((ThermalZone("a", 1.0), ThermalZone("a", 2.0))), "names must be unique"),
        (lambda: ThermalZone("cpu", float("nan")), "got nan"),
    ],
)
def test_readings_are_checked_at_construction(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        build()


def test_throttled_from_bits_keeps_the_raw_value() -> None:
    assert Throttled.from_bits(0x50005).raw == 0x50005
