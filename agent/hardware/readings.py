"""The sensors' readings as typed, frozen values: `SensorReadings` and its parts.

Made by `agent.hardware.sensors.Sensors.read` (the daemon's sampler thread, or the CLI),
read by the governor (`agent.governor`), the snapshot and the JSON documents. Every number
carries its unit in its name (``temp_c``, ``voltage_v``, ``current_a``, ``power_w``,
``percent``, ``rpm``); None means *unknown* (no such sensor, or it could not be read), never
zero. Values are checked at construction (a temperature must be finite and plausible, a
percentage within 0..100), so a garbled file can never reach the governor as a number:
the readers turn garbage into None before building these.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

#: temperatures outside this range (°C) are a broken sensor, not a reading
PLAUSIBLE_C = (-60.0, 200.0)


def _check(owner: object, name: str, value: float | None, low: float, high: float) -> None:
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{type(owner).__name__}.{name}: expected a number within {low}..{high}, got {value!r}")


def plausible_c(value: float | None) -> float | None:
    """`value` when it is a plausible temperature in °C, else None (unknown)."""
    if value is None or not math.isfinite(value) or not PLAUSIBLE_C[0] <= value <= PLAUSIBLE_C[1]:
        return None
    return value


@dataclass(frozen=True)
class TripPoint:
    """A thermal zone's trip point: the kernel acts (``passive``: throttles, ``critical``: shuts
    down, ``hot``, ``active``: a fan step) at `temp_c`, and undoes it `hyst_c` below."""

    temp_c: float
    type: str
    hyst_c: float = 0.0

    def __post_init__(self) -> None:
        _check(self, "temp_c", self.temp_c, *PLAUSIBLE_C)
        _check(self, "hyst_c", self.hyst_c, 0.0, 100.0)


@dataclass(frozen=True)
class ThermalZone:
    """One temperature sensor: `name` is unique in a reading set (the zone's type, with ``_1``,
    ``_2`` for repeats), `temp_c` None when it cannot be read."""

    name: str
    temp_c: float | None
    trips: tuple[TripPoint, ...] = ()

    def __post_init__(self) -> None:
        _check(self, "temp_c", self.temp_c, *PLAUSIBLE_C)


@dataclass(frozen=True)
class Rail:
    """One measured power rail (an INA3221 channel, a Pi 5 PMIC rail): volts, amperes, watts."""

    name: str
    voltage_v: float | None
    current_a: float | None
    power_w: float | None

    def __post_init__(self) -> None:
        _check(self, "voltage_v", self.voltage_v, 0.0, 1000.0)
        _check(self, "current_a", self.current_a, -1000.0, 1000.0)
        _check(self, "power_w", self.power_w, -100000.0, 100000.0)


@dataclass(frozen=True)
class Battery:
    """A battery or UPS: charge in percent, status (``Charging``, ``Discharging``, ``Full``,
    ``Not charging``, ``Unknown``), volts, amperes (negative while discharging where the driver
    signs it), watts drawn from or into it; `source` says where it was read."""

    percent: float | None
    status: str | None
    voltage_v: float | None
    current_a: float | None
    power_w: float | None
    source: str

    def __post_init__(self) -> None:
        _check(self, "percent", self.percent, 0.0, 100.0)
        _check(self, "voltage_v", self.voltage_v, 0.0, 1000.0)

    @property
    def discharging(self) -> bool:
        return (self.status or "").lower() == "discharging"


@dataclass(frozen=True)
class Throttled:
    """Raspberry Pi firmware flags (``vcgencmd get_throttled``): the state now and whether it
    happened since boot. `raw` is the bit field as the firmware gave it."""

    under_voltage: bool
    arm_frequency_capped: bool
    throttled: bool
    soft_temp_limit: bool
    under_voltage_since_boot: bool
    arm_frequency_capped_since_boot: bool
    throttled_since_boot: bool
    soft_temp_limit_since_boot: bool
    raw: int

    @classmethod
    def from_bits(cls, raw: int) -> Throttled:
        """Decode the firmware's bits: 0-3 now, 16-19 since boot (same order)."""

        def bit(n: int) -> bool:
            return bool(raw >> n & 1)

        return cls(bit(0), bit(1), bit(2), bit(3), bit(16), bit(17), bit(18), bit(19), raw)

    @property
    def any_now(self) -> bool:
        return self.under_voltage or self.arm_frequency_capped or self.throttled or self.soft_temp_limit


@dataclass(frozen=True)
class Fan:
    """A fan: its duty in percent of full speed and its speed in rpm (None where not measured)."""

    duty_percent: float | None
    rpm: float | None
    source: str

    def __post_init__(self) -> None:
        _check(self, "duty_percent", self.duty_percent, 0.0, 100.0)
        _check(self, "rpm", self.rpm, 0.0, 100000.0)


@dataclass(frozen=True)
class Gpu:
    """A GPU: integrated (Jetson devfreq) or discrete (NVML). Load in percent, memory in MiB."""

    name: str
    load_percent: float | None
    temp_c: float | None = None
    memory_used_mb: float | None = None
    memory_total_mb: float | None = None
    power_w: float | None = None
    freq_mhz: float | None = None

    def __post_init__(self) -> None:
        _check(self, "load_percent", self.load_percent, 0.0, 100.0)
        _check(self, "temp_c", self.temp_c, *PLAUSIBLE_C)


@dataclass(frozen=True)
class SensorReadings:
    """Every sensor at one moment. `power_w` is the board's input power and `power_source`
    what measured it (a rail name such as ``VDD_IN``, ``pmic``, ``battery``); `sources` names
    every sensor that answered (``thermal``, ``ina3221``, ``vcgencmd``, ...)."""

    thermal_zones: tuple[ThermalZone, ...] = ()
    rails: tuple[Rail, ...] = ()
    power_w: float | None = None
    power_source: str | None = None
    battery: Battery | None = None
    throttled: Throttled | None = None
    fan: Fan | None = None
    gpu: Gpu | None = None
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [zone.name for zone in self.thermal_zones]
        if len(set(names)) != len(names):
            raise ValueError(f"SensorReadings.thermal_zones: names must be unique, got {names}")

    @property
    def temp_c(self) -> float | None:
        """The hottest known temperature in °C (zones and the GPU); None when none is known."""
        known = [z.temp_c for z in self.thermal_zones if z.temp_c is not None]
        if self.gpu is not None and self.gpu.temp_c is not None:
            known.append(self.gpu.temp_c)
        return max(known) if known else None

    def trips(self, kind: str) -> list[float]:
        """The temperatures (°C) of every trip point of `kind` (``passive``, ``critical``)."""
        return sorted(t.temp_c for z in self.thermal_zones for t in z.trips if t.type == kind)

    def to_json(self) -> dict[str, Any]:
        """The ``sensors`` document of telemetry and ``edge-agent telemetry --json``."""
        return {
            "temp_c": self.temp_c,
            "thermal_zones": {z.name: z.temp_c for z in self.thermal_zones},
            "power_w": self.power_w,
            "power_source": self.power_source,
            "rails": {r.name: _without(r, "name") for r in self.rails},
            "battery": _without(self.battery, "source"),
            "throttled": _without(self.throttled, "raw"),
            "fan": _without(self.fan, "source"),
            "gpu": asdict(self.gpu) if self.gpu else None,
            "sources": list(self.sources),
        }


def _without(value: Any, *skip: str) -> dict[str, Any] | None:
    if value is None:
        return None
    return {f.name: getattr(value, f.name) for f in fields(value) if f.name not in skip}
