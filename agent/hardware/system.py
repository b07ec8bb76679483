"""CPU and memory of the machine and of this process, from psutil."""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class SystemReadings:
    """One sample: CPU in percent of all cores (averaged since the previous sample), memory in
    percent and MiB, this process's CPU (percent of one core) and resident memory (MiB)."""

    cpu_percent: float
    memory_percent: float
    memory_available_mb: float
    process_cpu_percent: float
    process_rss_mb: float


class SystemMonitor:
    """CPU and memory of the machine and of this process. `cpu_percent` is averaged since the
    previous call (psutil's interval semantics), so one thread samples it once per period."""

    def __init__(self, process: psutil.Process | None = None) -> None:
        self._process = process or psutil.Process()
        psutil.cpu_percent(None)  # the first call only starts the measurement
        self._process.cpu_percent(None)

    def sample(self) -> SystemReadings:
        memory = psutil.virtual_memory()
        return SystemReadings(
            cpu_percent=psutil.cpu_percent(None),
            memory_percent=memory.percent,
            memory_available_mb=round(memory.available / 2**20, 1),
            process_cpu_percent=self._process.cpu_percent(None),
            process_rss_mb=round(self._process.memory_info().rss / 2**20, 1),
        )
