"""Energy from power: `EnergyMeter` integrates the board's input power (`SensorReadings.power_w`,
watts) over the caller's monotonic clock by the trapezoid rule, one interval per pair of
readings in a row: ``(p0 + p1) / 2 * (t1 - t0)`` joules.

An interval is counted only when both of its ends were measured: where the power is unknown
(no sensor, a reading that failed, a negative or non-finite value) the meter counts nothing
until the next two readings in a row, so a gap is never filled with a guess; `measured_s` says
how much time the total covers. A clock that does not move forward counts nothing. The total
starts at zero with the process: a restart resets it (it is what this agent measured since it
started, not the board's lifetime; Prometheus' ``rate()`` takes a counter's reset in its stride).

`energy` is None until a first interval was counted (a board without a power reading never
has one). `Energy.wh_per_h` is the energy over the hours measured: watt-hours per hour.

Threads: `add` from one thread (the daemon's sampler); `energy` from any thread (one frozen
value, replaced whole). No I/O, no clock of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

JOULES_PER_WH = 3600.0


@dataclass(frozen=True)
class Energy:
    """What the meter counted since the agent started: `joules` over `measured_s` seconds of
    intervals whose both ends were measured."""

    joules: float
    measured_s: float

    @property
    def wh(self) -> float:
        """The energy in watt-hours."""
        return self.joules / JOULES_PER_WH

    @property
    def wh_per_h(self) -> float | None:
        """Watt-hours per hour measured (numerically the mean power in watts); None before any
        time was measured."""
        return self.wh / (self.measured_s / 3600.0) if self.measured_s > 0 else None


class EnergyMeter:
    """The running integral of power (W) over time (s); see the module."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None  # (now, power_w) of the last measured reading
        self._joules = 0.0
        self._measured_s = 0.0
        self.energy: Energy | None = None

    def add(self, power_w: float | None, now: float) -> None:
        """One reading: `power_w` watts (None: not measured) at `now` seconds (monotonic)."""
        if power_w is None or not math.isfinite(power_w) or power_w < 0:
            self._last = None  # a gap: the next interval starts at the next measured reading
            return
        last, self._last = self._last, (now, power_w)
        if last is None:
            return
        then, before = last
        if not now > then:  # the same moment again (the newer power kept) or a clock gone back (ignored)
            if now < then:
                self._last = last
            return
        self._joules += (before + power_w) / 2.0 * (now - then)
        self._measured_s += now - then
        self.energy = Energy(self._joules, self._measured_s)
