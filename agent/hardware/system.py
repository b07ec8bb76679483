"""CPU and memory of the machine and of this process, from psutil."""

from __future__ import annotations

import psutil


class SystemMonitor:
    """CPU and memory of the machine and of this process. `cpu_percent` is averaged since the
    previous call (psutil's interval semantics), so call it once per telemetry period."""

    def __init__(self, process: psutil.Process | None = None) -> None:
        self._process = process or psutil.Process()
        psutil.cpu_percent(None)  # the first call only starts the measurement
        self._process.cpu_percent(None)

    def sample(self) -> dict[str, float]:
        memory = psutil.virtual_memory()
        return {
            "cpu_percent": psutil.cpu_percent(None),
            "memory_percent": memory.percent,
            "memory_available_mb": round(memory.available / 2**20, 1),
            "process_cpu_percent": self._process.cpu_percent(None),
            "process_rss_mb": round(self._process.memory_info().rss / 2**20, 1),
        }
