"""The last minutes of the agent for the page's charts: `History`, a bounded series of points.

The server's sampler thread records a point from the snapshot every ``status_page.sample_s``
seconds, so a technician who opens the page sees the minutes before they arrived. Each point
holds, per camera, the FPS and the median end-to-end latency, and for the board the hottest
temperature, the input power and the battery charge (None: unknown).

It also measures what "normal" is: the highest FPS each camera reached in its first
`REFERENCE_S` seconds on the version it serves (`reference_fps`), which the page's problem
list compares the FPS with. Thread safety: `record` from one thread, the readers from any
(one lock).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from agent.snapshot import AgentSnapshot

#: seconds after a camera starts on a version during which its reference FPS is measured
REFERENCE_S = 60.0


@dataclass(frozen=True)
class CameraPoint:
    fps: float
    latency_ms: float | None  # median end to end (capture to detections)


@dataclass(frozen=True)
class Point:
    ts: float  # Unix seconds
    cameras: tuple[tuple[str, CameraPoint], ...]
    temp_c: float | None
    power_w: float | None
    battery_percent: float | None


@dataclass
class _Reference:
    sha256: str
    since_ts: float
    fps: float = 0.0


class History:
    """At most `points` points, oldest dropped."""

    def __init__(self, points: int) -> None:
        self._points: deque[Point] = deque(maxlen=points)
        self._references: dict[str, _Reference] = {}
        self._lock = threading.Lock()

    def record(self, snapshot: AgentSnapshot) -> None:
        sensors = snapshot.sensors
        battery = sensors.battery if sensors else None
        point = Point(
            ts=snapshot.ts,
            cameras=tuple(
                (c.name, CameraPoint(c.fps, c.latency_ms["total"].p50 if "total" in c.latency_ms else None))
                for c in snapshot.cameras
            ),
            temp_c=sensors.temp_c if sensors else None,
            power_w=sensors.power_w if sensors else None,
            battery_percent=battery.percent if battery else None,
        )
        with self._lock:
            self._points.append(point)
            if snapshot.bundle is not None:
                self._measure(snapshot, snapshot.bundle.sha256)

    def _measure(self, snapshot: AgentSnapshot, sha256: str) -> None:
        for camera in snapshot.cameras:
            reference = self._references.get(camera.name)
            if reference is None or reference.sha256 != sha256:
                reference = self._references[camera.name] = _Reference(sha256, snapshot.ts)
            measuring = snapshot.ts - reference.since_ts <= REFERENCE_S
            if measuring and not camera.paused and camera.source_status.state == "running":
                reference.fps = max(reference.fps, camera.fps)

    def reference_fps(self, now: float) -> dict[str, float]:
        """Each camera's reference FPS once its first `REFERENCE_S` seconds on the version it
        serves are over (Unix seconds `now`); cameras still being measured are left out."""
        with self._lock:
            return {name: r.fps for name, r in self._references.items() if now - r.since_ts > REFERENCE_S and r.fps > 0}

    def to_json(self, since: float = 0.0) -> dict[str, Any]:
        """The points newer than `since` (Unix seconds) as columns: ``ts``, ``temp_c``,
        ``power_w``, ``battery_percent`` and per camera ``fps`` and ``latency_ms``, aligned
        with ``ts`` (null where a camera did not run)."""
        with self._lock:
            points = [p for p in self._points if p.ts > since]
        names = sorted({name for p in points for name, _ in p.cameras})
        cameras: dict[str, dict[str, list[float | None]]] = {n: {"fps": [], "latency_ms": []} for n in names}
        for point in points:
            by_name = dict(point.cameras)
            for name in names:
                camera = by_name.get(name)
                cameras[name]["fps"].append(camera.fps if camera else None)
                cameras[name]["latency_ms"].append(camera.latency_ms if camera else None)
        return {
            "ts": [round(p.ts, 3) for p in points],
            "temp_c": [p.temp_c for p in points],
            "power_w": [p.power_w for p in points],
            "battery_percent": [p.battery_percent for p in points],
            "cameras": cameras,
        }
