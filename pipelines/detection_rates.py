"""What one camera's model has been seeing lately: confident detections per class over a window.

`DetectionRates` keeps, per bucket of `BUCKET_S` seconds of its clock, the frames inferred and,
per class id, the detections at or above `CONFIDENT` and the sum of their confidences; buckets
older than `WINDOW_S` fall out. A pipeline owns one per detector it serves (a swap starts a new
one), so `Rates` just before a swap are what the previous version saw, and after it what the new
one sees: probation compares the two (`agent.deployment.quality`). Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pipelines.decoding.detections import Detections

#: the confidence from which a detection counts as confident (`pipelines.measure.comparison` too)
CONFIDENT = 0.5
#: seconds of history kept
WINDOW_S = 600.0
#: seconds per bucket of that history
BUCKET_S = 10.0


@dataclass(frozen=True)
class ClassRate:
    """One class over a window: confident detections and the sum of their confidences."""

    count: int
    confidence_sum: float

    @property
    def mean_confidence(self) -> float:
        return self.confidence_sum / self.count if self.count else 0.0


@dataclass(frozen=True)
class Rates:
    """A camera's confident detections over `seconds` (clock seconds from its first frame in the
    window to now) and `frames` inferred frames, per class id."""

    frames: int = 0
    seconds: float = 0.0
    classes: Mapping[int, ClassRate] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def count(self) -> int:
        return sum(c.count for c in self.classes.values())

    def per_frame(self, class_id: int | None = None) -> float:
        """Confident detections per frame, of `class_id` or of all classes (0.0 without frames)."""
        if not self.frames:
            return 0.0
        if class_id is None:
            return self.count / self.frames
        rate = self.classes.get(class_id)
        return rate.count / self.frames if rate is not None else 0.0


@dataclass
class _Bucket:
    start: float
    frames: int = 0
    counts: dict[int, int] = field(default_factory=dict)
    sums: dict[int, float] = field(default_factory=dict)


class DetectionRates:
    """The rolling window of one camera under one model; `add` from the inference thread that
    delivers results, `rates` from any thread."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S) -> None:
        self._clock, self.window_s = clock, window_s
        self._lock = threading.Lock()
        self._buckets: deque[_Bucket] = deque()

    def add(self, detections: Detections) -> None:
        """Count one inferred frame and its confident detections."""
        now = self._clock()
        confident = detections.confidence >= CONFIDENT
        classes, scores = detections.class_id[confident].tolist(), detections.confidence[confident].tolist()
        with self._lock:
            self._expire(now)
            if not self._buckets or now - self._buckets[-1].start >= BUCKET_S:
                self._buckets.append(_Bucket(now))
            bucket = self._buckets[-1]
            bucket.frames += 1
            for class_id, score in zip(classes, scores, strict=True):
                bucket.counts[class_id] = bucket.counts.get(class_id, 0) + 1
                bucket.sums[class_id] = bucket.sums.get(class_id, 0.0) + score

    def _expire(self, now: float) -> None:
        while self._buckets and now - self._buckets[0].start > self.window_s:
            self._buckets.popleft()

    def rates(self) -> Rates:
        """The window as it stands now."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            buckets = list(self._buckets)
            counts: dict[int, int] = {}
            sums: dict[int, float] = {}
            for bucket in buckets:
                for class_id, n in bucket.counts.items():
                    counts[class_id] = counts.get(class_id, 0) + n
                    sums[class_id] = sums.get(class_id, 0.0) + bucket.sums[class_id]
        return Rates(
            frames=sum(b.frames for b in buckets),
            seconds=now - buckets[0].start if buckets else 0.0,
            classes=MappingProxyType({c: ClassRate(n, sums[c]) for c, n in sorted(counts.items())}),
        )
