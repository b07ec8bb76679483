"""The sampler: the daemon's thread ``sampler``, one tick every ``telemetry.interval_s``.

A tick samples the system (CPU, memory, the state directory's disk, the clock), reads the
sensors, adds the input power to the energy meter (`agent.hardware.energy`, on `monotonic`),
steps the governor (`agent.daemon.governing.Governing`, which carries its decision
out on the cameras and the fan), then calls `after` (the daemon publishes telemetry and the
status there, when it has a broker). `start` takes one sample at once, so the first snapshot
already has readings.

Threads: the ticks run on the ``sampler`` thread (a `pipelines.worker.Worker`: a tick that fails,
say because the process ran out of file descriptors and `/proc/meminfo` cannot be opened, is
logged and counted and the next one comes after a backoff; the thread goes on); `system`,
`readings`, `energy.energy` and `governor` are one reference each, read from any thread.
`loop()` says when the thread promised to turn again, whether its ticks fail and whether it
ended, for `Agent.health()`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent.daemon.governing import Governing
from agent.hardware.energy import EnergyMeter
from agent.hardware.readings import SensorReadings
from agent.hardware.sensors import Sensors
from agent.hardware.system import SystemMonitor, SystemReadings
from agent.snapshot import GovernorState
from pipelines.backoff import Backoff
from pipelines.worker import LoopState, Worker

log = logging.getLogger(__name__)

#: the sampler in `Health`'s words
NAME = "the sampler (sensors, governor, telemetry)"


class Sampler:
    """Samples `monitor` and `sensors` and steps `governing` (None: the governor is off) every
    `interval_s` seconds, then calls `after`. `monotonic` is the clock its turns are announced
    on (seconds); `backoff` paces the ticks after a failed one (the worker's default: 1 s
    doubling to 60 s)."""

    def __init__(
        self,
        interval_s: float,
        monitor: SystemMonitor,
        sensors: Sensors,
        governing: Governing | None,
        after: Callable[[], None],
        monotonic: Callable[[], float] = time.monotonic,
        backoff: Backoff | None = None,
    ) -> None:
        self.interval_s, self.monitor, self.sensors, self.governing = interval_s, monitor, sensors, governing
        self._after, self._monotonic = after, monotonic
        self.system: SystemReadings | None = None  # the latest system sample
        self.readings: SensorReadings | None = None  # the latest sensor reading
        self.energy = EnergyMeter()  # the input power integrated over `monotonic` since the start
        self._worker = Worker(
            "sampler", self._tick, described=NAME, budget_s=interval_s, monotonic=monotonic, backoff=backoff
        )

    @property
    def governor(self) -> GovernorState | None:
        """The governor as last carried out (None: off, or not stepped yet)."""
        return self.governing.state if self.governing is not None else None

    def sample(self) -> None:
        """One tick: the system and sensor readings, then the governor's step."""
        self.system = self.monitor.sample()
        self.readings = self.sensors.read()
        self.energy.add(self.readings.power_w, self._monotonic())
        if self.governing is not None:
            self.governing.step(self.readings)

    def start(self) -> None:
        """One sample now (one that fails is logged: the thread tries again), then the
        ``sampler`` thread, its first tick `interval_s` from now."""
        try:
            self.sample()
        except Exception:
            log.exception("sampler: the first sample failed; the sampler thread tries again")
        self._worker.start(delay_s=self.interval_s)

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread (after its tick in progress), then close the sensors and the fan."""
        self._worker.stop(timeout)
        self.sensors.close()
        if self.governing is not None:
            self.governing.close()

    def loop(self) -> LoopState:
        """How far the thread is past its announced turn, whether its ticks fail, or why it
        ended (any thread)."""
        return self._worker.state()

    def _tick(self) -> float:
        self.sample()
        self._after()
        return self.interval_s
