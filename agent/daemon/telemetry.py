"""What the ``telemetry`` topic carries: per-camera FPS, drops and stage latencies, CPU and
memory from psutil, the broker link, and a `sensors` object that the temperature, power and
battery readers fill in (empty until those land)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any


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
