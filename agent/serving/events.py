"""Detection events for the ``events`` topic, rate-limited per camera and label."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from agent.config.models import EventsSection
from pipelines.detections import Detections
from pipelines.sources import Frame

Publish = Callable[[dict[str, object]], None]


class EventLimiter:
    """Allows one event per key every `min_interval` seconds (times from `clock`, in seconds)."""

    def __init__(self, min_interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.min_interval, self._clock = min_interval, clock
        self._last: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self.suppressed = 0

    def allow(self, key: tuple[str, str]) -> bool:
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.min_interval:
                self.suppressed += 1
                return False
            self._last[key] = now
            return True


class EventSink:
    """A pipeline sink turning detections into events: for each label in a frame, its most
    confident detection at or above `min_confidence`, if the limiter lets it through."""

    def __init__(self, settings: EventsSection, labels: Callable[[], Sequence[str]], publish: Publish) -> None:
        self.settings, self._labels, self._publish = settings, labels, publish
        self.limiter = EventLimiter(settings.min_interval_s)
        self.published = 0

    def for_pipeline(self, name: str) -> Callable[[Frame, Detections], None]:
        def sink(frame: Frame, detections: Detections) -> None:
            self.handle(name, frame, detections)

        return sink

    def handle(self, pipeline: str, frame: Frame, detections: Detections) -> None:
        if not self.settings.enabled or len(detections) == 0:
            return
        labels = self._labels()
        wanted = set(self.settings.labels)
        keep = detections[detections.confidence >= self.settings.min_confidence]
        for class_id in sorted(set(keep.class_id.tolist())):
            label = labels[class_id] if 0 <= class_id < len(labels) else str(class_id)
            if wanted and label not in wanted:
                continue
            same = keep[keep.class_id == class_id]
            best = int(same.confidence.argmax())
            if not self.limiter.allow((pipeline, label)):
                continue
            self.published += 1
            self._publish(
                {
                    "ts": round(time.time(), 3),
                    "pipeline": pipeline,
                    "frame": frame.index,
                    "label": label,
                    "class_id": int(class_id),
                    "confidence": round(float(same.confidence[best]), 4),
                    "box": [round(float(v), 1) for v in same.xyxy[best]],
                    "count": len(same),
                }
            )
