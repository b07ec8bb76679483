"""Pipeline metrics: per-stage latency percentiles and FPS over a sliding window.

Both take an injected ``clock`` (seconds, monotonic) so tests control time. Thread-safe: the
pipeline thread records while the status page or telemetry reads.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

STAGES = ("capture_age", "preprocess", "inference", "postprocess", "total")


@dataclass(frozen=True)
class Percentiles:
    """Median and 95th percentile of one stage's latency, in milliseconds."""

    p50: float
    p95: float


class LatencyWindow:
    """The last `size` latencies of each stage, in milliseconds."""

    def __init__(self, stages: Iterable[str] = STAGES, size: int = 300) -> None:
        self._values = {stage: deque[float](maxlen=size) for stage in stages}
        self._lock = threading.Lock()

    def record(self, **latencies_ms: float) -> None:
        with self._lock:
            for stage, value in latencies_ms.items():
                self._values[stage].append(value)

    def percentiles(self) -> dict[str, Percentiles]:
        """Each stage with samples, in the order the stages were given."""
        with self._lock:
            samples = {stage: np.array(values) for stage, values in self._values.items() if values}
        quantiles = {stage: np.percentile(v, [50, 95]) for stage, v in samples.items()}
        return {stage: Percentiles(round(float(q[0]), 3), round(float(q[1]), 3)) for stage, q in quantiles.items()}


class FpsMeter:
    """Frames per second over the last `window_s` seconds."""

    def __init__(self, window_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s, self._clock = window_s, clock
        self._stamps: deque[float] = deque()
        self._lock = threading.Lock()

    def tick(self) -> None:
        now = self._clock()
        with self._lock:
            self._stamps.append(now)
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._stamps and self._stamps[0] < now - self._window_s:
            self._stamps.popleft()

    @property
    def fps(self) -> float:
        now = self._clock()
        with self._lock:
            self._trim(now)
            if len(self._stamps) < 2:
                return 0.0
            span = self._stamps[-1] - self._stamps[0]
            return (len(self._stamps) - 1) / span if span > 0 else 0.0
