"""What the ``telemetry`` topic carries: per-camera FPS, drops and stage latencies, CPU and
memory from psutil, the broker link, and a `sensors` object that the temperature, power and
battery readers fill in (empty until those land)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

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


def telemetry_document(
    device: str,
    pipelines: Sequence[Mapping[str, Any]],
    system: Mapping[str, float],
    link: Mapping[str, Any] | None,
    sensors: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One telemetry message (latencies in ms, fps in frames per second)."""
    return {
        "ts": round(time.time(), 3),
        "device": device,
        "fps": round(sum(float(p["fps"]) for p in pipelines), 2),
        "dropped": sum(int(p["dropped"]) for p in pipelines),
        "pipelines": [
            {k: p[k] for k in ("name", "fps", "frames", "dropped", "errors", "paused", "latency_ms", "source_status")}
            for p in pipelines
        ],
        "system": dict(system),
        "sensors": dict(sensors or {}),
        "mqtt": {k: link[k] for k in ("queued", "dropped", "reconnects")} if link else None,
    }
