"""The governor's values: its levels, the thresholds it resolved, the actions it asks for and
the `Decision` each step returns. All frozen; temperatures in °C, charge in percent, times in
the seconds of the clock the caller passes as ``now`` (the daemon's monotonic clock).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal


class _Level(str, Enum):
    """A level that reads, prints and serialises as its name."""

    def __str__(self) -> str:
        return str(self.value)


class ThermalLevel(_Level):
    """How hot the board is, mildest first."""

    NORMAL = "NORMAL"
    WARM = "WARM"
    HOT = "HOT"
    CRITICAL = "CRITICAL"


class BatteryLevel(_Level):
    """How empty the battery is (``OK`` also when there is no battery or its charge is unknown)."""

    OK = "OK"
    LOW = "LOW"
    CRITICAL = "CRITICAL"


#: how severe each level is, to name the one that governs (a battery CRITICAL stops everything).
#: Two tables: the enums are strings, so thermal and battery CRITICAL are equal as dict keys.
THERMAL_SEVERITY = {ThermalLevel.NORMAL: 0, ThermalLevel.WARM: 1, ThermalLevel.HOT: 3, ThermalLevel.CRITICAL: 4}
BATTERY_SEVERITY = {BatteryLevel.OK: 0, BatteryLevel.LOW: 2, BatteryLevel.CRITICAL: 5}

ThresholdSource = Literal["config", "trip points", "default"]


@dataclass(frozen=True)
class TemperatureThresholds:
    """The temperatures (°C) at which WARM, HOT and CRITICAL begin, where each came from, and
    the hysteresis; checked increasing at construction."""

    warm_c: float
    hot_c: float
    critical_c: float
    hysteresis_c: float
    sources: tuple[ThresholdSource, ThresholdSource, ThresholdSource]

    def __post_init__(self) -> None:
        if not self.warm_c < self.hot_c < self.critical_c:
            raise ValueError(
                "TemperatureThresholds: expected warm_c < hot_c < critical_c, "
                f"got {self.warm_c}, {self.hot_c}, {self.critical_c}"
            )
        if self.hysteresis_c < 0:
            raise ValueError(f"TemperatureThresholds.hysteresis_c: expected >= 0, got {self.hysteresis_c}")

    def start_of(self, level: ThermalLevel) -> float:
        """The temperature at which `level` begins (NORMAL: minus infinity)."""
        return {
            ThermalLevel.NORMAL: float("-inf"),
            ThermalLevel.WARM: self.warm_c,
            ThermalLevel.HOT: self.hot_c,
            ThermalLevel.CRITICAL: self.critical_c,
        }[level]


@dataclass(frozen=True)
class Actions:
    """What the cameras and the fan should do: an FPS cap per camera without a motion gate
    (None: none), the slowdown of the motion gates (their idle interval and keepalive period
    times `gate_slowdown`, >= 1) and the FPS cap of the cameras with one (`gated_fps_cap`),
    paused inference, the fan's duty in percent (None: leave it), the artifact to serve
    (``default`` as the runtime policy chooses, or the bundle's ``lighter`` one), and a clean
    stop."""

    fps_cap: float | None = None
    paused: bool = False
    fan_percent: float | None = None
    artifact: Literal["default", "lighter"] = "default"
    stopped: bool = False
    gate_slowdown: float = 1.0
    gated_fps_cap: float | None = None

    def __post_init__(self) -> None:
        for name, cap in (("fps_cap", self.fps_cap), ("gated_fps_cap", self.gated_fps_cap)):
            if cap is not None and not cap > 0:
                raise ValueError(f"Actions.{name}: expected a positive number or None, got {cap}")
        if not 1.0 <= self.gate_slowdown < float("inf"):
            raise ValueError(f"Actions.gate_slowdown: expected a finite number >= 1, got {self.gate_slowdown}")
        if self.fan_percent is not None and not 0 <= self.fan_percent <= 100:
            raise ValueError(f"Actions.fan_percent: expected 0..100 or None, got {self.fan_percent}")


@dataclass(frozen=True)
class Decision:
    """The governor after one step.

    `level` names the more severe of `thermal` and `battery` (a battery level reads ``LOW`` or
    ``CRITICAL``, the `battery` field says which axis); `reason` says why in words; `since` is
    when the governing level began and `thermal_since` / `battery_since` when each axis last
    changed (caller's clock); `changed` is true on the step that made a transition;
    `temp_c` and `battery_percent` are what the step saw (None: unknown).
    """

    level: str
    thermal: ThermalLevel
    battery: BatteryLevel
    reason: str
    since: float
    thermal_since: float
    battery_since: float
    actions: Actions
    thresholds: TemperatureThresholds | None
    changed: bool
    temp_c: float | None
    battery_percent: float | None
