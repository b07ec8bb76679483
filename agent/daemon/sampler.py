"""The sampler: the daemon's thread ``sampler``, one tick every ``telemetry.interval_s``.

A tick samples the system (CPU, memory, the state directory's disk, the clock), reads the
sensors, steps the governor (`agent.daemon.governing.Governing`, which carries its decision
out on the cameras and the fan), then calls `after` (the daemon publishes telemetry and the
status there, when it has a broker). `start` takes one sample at once, so the first snapshot
already has readings.

Threads: the ticks run on the ``sampler`` thread; `system`, `readings` and `governor` are one
reference each, read from any thread. `loop()` says when the thread promised to turn again and
whether it ended, for `Agent.health()`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from agent.daemon.governing import Governing
from agent.hardware.readings import SensorReadings
from agent.hardware.sensors import Sensors
from agent.hardware.system import SystemMonitor, SystemReadings
from agent.snapshot import GovernorState, LoopState

log = logging.getLogger(__name__)

#: the sampler in `Health`'s words
NAME = "the sampler (sensors, governor, telemetry)"


class Sampler:
    """Samples `monitor` and `sensors` and steps `governing` (None: the governor is off) every
    `interval_s` seconds, then calls `after`. `monotonic` is the clock its turns are announced
    on (seconds)."""

    def __init__(
        self,
        interval_s: float,
        monitor: SystemMonitor,
        sensors: Sensors,
        governing: Governing | None,
        after: Callable[[], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s, self.monitor, self.sensors, self.governing = interval_s, monitor, sensors, governing
        self._after, self._monotonic = after, monotonic
        self.system: SystemReadings | None = None  # the latest system sample
        self.readings: SensorReadings | None = None  # the latest sensor reading
        self._due = monotonic()  # when the thread promised to turn again
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ended: str | None = None

    @property
    def governor(self) -> GovernorState | None:
        """The governor as last carried out (None: off, or not stepped yet)."""
        return self.governing.state if self.governing is not None else None

    def sample(self) -> None:
        """One tick: the system and sensor readings, then the governor's step."""
        self.system = self.monitor.sample()
        self.readings = self.sensors.read()
        if self.governing is not None:
            self.governing.step(self.readings)

    def start(self) -> None:
        """One sample now, then the ``sampler`` thread."""
        self._stop.clear()
        self._ended = None
        self.sample()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """End the thread (after its tick in progress), then close the sensors and the fan."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.sensors.close()
        if self.governing is not None:
            self.governing.close()

    def loop(self) -> LoopState:
        """How far the thread is past its announced turn, or why it ended (any thread)."""
        if self._thread is None:
            return LoopState(NAME)
        if not self._thread.is_alive() and not self._stop.is_set():
            return LoopState(NAME, ended=self._ended or "its thread is not running")
        return LoopState(NAME, stalled_s=max(0.0, self._monotonic() - self._due))

    def _run(self) -> None:
        try:
            while True:
                self._due = self._monotonic() + self.interval_s
                if self._stop.wait(self.interval_s):
                    return
                self.sample()
                self._after()
        except BaseException as exc:
            self._ended = f"{type(exc).__name__}: {exc}"
            raise
