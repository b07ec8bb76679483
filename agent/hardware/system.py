"""CPU and memory of the machine and of this process (psutil), the free space of the state
directory's disk, and whether the clock is synchronised (`agent.hardware.clock`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class SystemReadings:
    """One sample: CPU in percent of all cores (averaged since the previous sample), memory in
    percent and MiB, this process's CPU (percent of one core) and resident memory (MiB); the
    state directory's disk, free and total in MiB (None: not measured), and whether it is mounted
    read-only (an SD card the kernel remounted after errors; None: not measured); the clock
    synchronised (None: unknown)."""

    cpu_percent: float
    memory_percent: float
    memory_available_mb: float
    process_cpu_percent: float
    process_rss_mb: float
    disk_free_mb: float | None = None
    disk_total_mb: float | None = None
    clock_synchronised: bool | None = None
    disk_read_only: bool | None = None


class SystemMonitor:
    """CPU and memory of the machine and of this process. `cpu_percent` is averaged since the
    previous call (psutil's interval semantics), so one thread samples it once per period.
    `disk_path` is the folder whose disk is measured (the state directory; None: none);
    `clock` says whether the clock is synchronised (None: not asked)."""

    def __init__(
        self,
        process: psutil.Process | None = None,
        *,
        disk_path: Path | None = None,
        clock: Callable[[], bool | None] | None = None,
    ) -> None:
        self._process = process or psutil.Process()
        self._disk_path, self._clock = disk_path, clock
        psutil.cpu_percent(None)  # the first call only starts the measurement
        self._process.cpu_percent(None)

    def sample(self) -> SystemReadings:
        memory = psutil.virtual_memory()
        free_mb = total_mb = read_only = None
        if self._disk_path is not None:
            try:
                disk = psutil.disk_usage(str(self._disk_path))
                free_mb, total_mb = round(disk.free / 2**20, 1), round(disk.total / 2**20, 1)
                read_only = bool(os.statvfs(self._disk_path).f_flag & os.ST_RDONLY)
            except OSError:
                pass  # not created yet, or unmounted: unknown
        return SystemReadings(
            cpu_percent=psutil.cpu_percent(None),
            memory_percent=memory.percent,
            memory_available_mb=round(memory.available / 2**20, 1),
            process_cpu_percent=self._process.cpu_percent(None),
            process_rss_mb=round(self._process.memory_info().rss / 2**20, 1),
            disk_free_mb=free_mb,
            disk_total_mb=total_mb,
            disk_read_only=read_only,
            clock_synchronised=self._clock() if self._clock is not None else None,
        )
