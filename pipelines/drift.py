"""Drift: what one camera's model reports now against what it reported when its version was new.

A `Summary` is a bounded tally of inferred frames' detections: the class mix (label -> count,
at most `MAX_LABELS` labels, the rest under `OTHER`), a confidence histogram (`CONF_BINS`
equal bins over 0..1), a box-size histogram (each box's area as a share of the frame, in
`AREA_BINS` log10 bins from 1e-4 to 1, smaller boxes in the first), the detections, the frames
and the seconds covered (the gaps between inferred frames, each counted up to `GAP_CAP_S`, so
a restart, a pause or a stopped camera adds nothing). `Summary.to_json` is a document of a few
hundred bytes whatever the traffic; `Summary.from_json` reads one back, checking every field
(a file from the state directory is still an input).

`DriftTracker` keeps one camera under one version: the baseline, its first `baseline_s` seconds
covered (then frozen), and the current window, the last `window_s` seconds in `WINDOW_BUCKETS`
buckets (the oldest fall out). `report()` gives the drift score once the baseline is complete
and the window has covered at least `WINDOW_MIN_SHARE` of its length, else None.

The score, 0..1, is the largest of four parts, each 0..1:

- the Jensen-Shannon distance (square root of the JS divergence, log base 2) between the two
  class mixes, between the two confidence histograms and between the two box-size histograms:
  symmetric, bounded by 1 without tuning, defined where one side has a bin the other lacks
  (Kullback-Leibler is not), and 0 for the same distribution; a histogram empty on one side
  only is 1, on both 0;
- half the rate term, ``1 - min(a, b) / max(a, b)`` of the detections per minute (0 for the
  same rate, 0.5 for half or double, 1 for a camera that went silent), halved since traffic
  swings by weekday and season while the model sees the same: only a rate down to about a
  third or up threefold reaches the default threshold on its own.

The largest, not the mean: one part changed entirely is drift even where the other three held
(a mean of four would show a class mix swapped entirely as 0.25 and a 75/25 mix turned 25/75,
a JS distance of 0.44, as 0.11), and it names what changed most. The default threshold, 0.3,
sits well above sampling noise, a few hundredths with hundreds of detections on each side
(tests/pipelines/test_drift.py), and below a 75/25 class mix turned around.

Cost: a few dictionary and list increments per detection; the whole update of a frame with 5
detections (`agent.serving.drift_watch.DriftWatch.observe`) is about 22 µs of CPU, 0.03 % of one core
at 15 FPS (0.05 % with 20 detections), and a score about 0.3 ms (bench/drift_cost.py,
docs/benchmarks.md, the shared 2-vCPU development VM). Threads: one camera's inference thread
calls `add`; `report` from any thread (a lock guards the window).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

#: equal confidence bins over 0..1
CONF_BINS = 10
#: log10 bins of a box's share of the frame, from 10**AREA_LOG_MIN to 1 (smaller: the first bin)
AREA_BINS = 8
AREA_LOG_MIN = -4.0
#: labels kept by name; further labels count under OTHER
MAX_LABELS = 32
OTHER = "(other)"
#: the most seconds one gap between two inferred frames counts for (above: the camera was not watching)
GAP_CAP_S = 60.0
#: buckets of the current window
WINDOW_BUCKETS = 48
#: the share of the window that must be covered before a score is given
WINDOW_MIN_SHARE = 0.5
#: the rate term's weight in the score (module docstring)
RATE_WEIGHT = 0.5
#: a document's most bytes (a summary is a few hundred)
MAX_DOCUMENT_BYTES = 16_384


def _bin_of_confidence(scores: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    return np.clip((scores * CONF_BINS).astype(np.intp), 0, CONF_BINS - 1)


def _bin_of_area(shares: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    logs = np.log10(np.maximum(shares, 1e-12))
    bins: npt.NDArray[np.intp] = np.floor((logs - AREA_LOG_MIN) / (-AREA_LOG_MIN / AREA_BINS)).astype(np.intp)
    return np.clip(bins, 0, AREA_BINS - 1)


@dataclass
class Summary:
    """A bounded tally of detections (see the module's docstring); mutable, owned by one tracker."""

    classes: dict[str, int] = field(default_factory=dict)
    confidence: list[int] = field(default_factory=lambda: [0] * CONF_BINS)
    area: list[int] = field(default_factory=lambda: [0] * AREA_BINS)
    detections: int = 0
    frames: int = 0
    seconds: float = 0.0

    def add(self, labels: Sequence[str], scores: npt.NDArray[Any], shares: npt.NDArray[Any], gap_s: float) -> None:
        """One inferred frame: its detections' labels, scores (0..1) and area shares (0..1), and
        the seconds since the frame before (counted up to `GAP_CAP_S`)."""
        self.frames += 1
        self.seconds += min(max(gap_s, 0.0), GAP_CAP_S)
        self.detections += len(labels)
        for label in labels:
            self._count(label, 1)
        for i in _bin_of_confidence(scores).tolist():
            self.confidence[i] += 1
        for i in _bin_of_area(shares).tolist():
            self.area[i] += 1

    def _count(self, label: str, n: int) -> None:
        if label not in self.classes and len(self.classes) >= MAX_LABELS:
            label = OTHER
        self.classes[label] = self.classes.get(label, 0) + n

    def merge(self, other: Summary) -> None:
        for label, n in other.classes.items():
            self._count(label, n)
        self.confidence = [a + b for a, b in zip(self.confidence, other.confidence, strict=True)]
        self.area = [a + b for a, b in zip(self.area, other.area, strict=True)]
        self.detections += other.detections
        self.frames += other.frames
        self.seconds += other.seconds

    @property
    def per_minute(self) -> float:
        """Detections per minute covered (0.0 before any time was)."""
        return self.detections * 60.0 / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "classes": dict(sorted(self.classes.items())),
            "confidence": list(self.confidence),
            "area": list(self.area),
            "detections": self.detections,
            "frames": self.frames,
            "seconds": round(self.seconds, 3),
        }

    @staticmethod
    def from_json(data: object) -> Summary:
        """A summary from `to_json`'s document; `ValueError` for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        classes, confidence, area = data.get("classes"), data.get("confidence"), data.get("area")
        if not isinstance(classes, dict) or len(classes) > MAX_LABELS + 1:
            raise ValueError(f"classes: expected an object of at most {MAX_LABELS + 1} labels")
        detections, frames, seconds = data.get("detections"), data.get("frames"), data.get("seconds")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds < 1e9:
            raise ValueError(f"seconds: expected a number of seconds, got {seconds!r}")
        return Summary(
            {str(k): _count_value(k, v) for k, v in classes.items()},
            [_count_value("confidence", v) for v in _list(confidence, CONF_BINS)],
            [_count_value("area", v) for v in _list(area, AREA_BINS)],
            _count_value("detections", detections),
            _count_value("frames", frames),
            float(seconds),
        )


def _list(value: object, length: int) -> list[object]:
    if not isinstance(value, list) or len(value) != length:
        raise ValueError(f"expected a list of {length} counts, got {value!r:.80}")
    return value


def _count_value(name: object, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**53:
        raise ValueError(f"{name!s:.40}: expected a count, got {value!r:.40}")
    return value


def js_distance(p: Mapping[str, int] | Sequence[int], q: Mapping[str, int] | Sequence[int]) -> float:
    """The Jensen-Shannon distance (base 2, 0..1) between two tallies: by key for mappings, by
    position for sequences; 0.0 when both are empty, 1.0 when only one is."""
    if isinstance(p, Mapping) and isinstance(q, Mapping):
        keys = sorted(set(p) | set(q))
        a = np.array([p.get(k, 0) for k in keys], dtype=np.float64)
        b = np.array([q.get(k, 0) for k in keys], dtype=np.float64)
    else:
        a, b = np.array(list(p), dtype=np.float64), np.array(list(q), dtype=np.float64)
    sa, sb = a.sum(), b.sum()
    if sa == 0 or sb == 0:
        return 0.0 if sa == sb else 1.0
    a, b = a / sa, b / sb
    m = (a + b) / 2

    def kl(x: npt.NDArray[np.float64]) -> float:
        nz = x > 0
        return float(np.sum(x[nz] * np.log2(x[nz] / m[nz])))

    return math.sqrt(max(0.0, min(1.0, (kl(a) + kl(b)) / 2)))


def rate_distance(a: float, b: float) -> float:
    """``1 - min/max`` of two rates: 0.0 the same (or both 0), 0.5 half, 1.0 one is 0."""
    high = max(a, b)
    return 0.0 if high <= 0 else 1.0 - min(a, b) / high


@dataclass(frozen=True)
class DriftScore:
    """The score (0..1) and its four parts (`rate` already weighted), with a sentence on what
    changed most."""

    score: float
    classes: float
    confidence: float
    area: float
    rate: float
    changed: str


def _conf_centre(i: int) -> float:
    return (i + 0.5) / CONF_BINS


def _area_centre(i: int) -> float:
    step = -AREA_LOG_MIN / AREA_BINS
    return float(10 ** (AREA_LOG_MIN + (i + 0.5) * step))


def _mean(histogram: Sequence[int], centre: Callable[[int], float]) -> float:
    total = sum(histogram)
    return sum(n * centre(i) for i, n in enumerate(histogram)) / total if total else 0.0


def compare(baseline: Summary, current: Summary) -> DriftScore:
    """The drift score of `current` against `baseline` (module docstring) and what changed most."""
    parts = {
        "classes": js_distance(baseline.classes, current.classes),
        "confidence": js_distance(baseline.confidence, current.confidence),
        "area": js_distance(baseline.area, current.area),
        "rate": RATE_WEIGHT * rate_distance(baseline.per_minute, current.per_minute),
    }
    most = max(parts, key=lambda k: parts[k])
    if most == "classes":
        before, now = _shares(baseline.classes), _shares(current.classes)
        # the label whose share moved most; of two that moved as much, the one that grew (what is new)
        moved = sorted(
            set(before) | set(now), key=lambda k: (abs(now.get(k, 0.0) - before.get(k, 0.0)), now.get(k, 0.0))
        )
        label = moved[-1] if moved else "-"
        changed = f"class mix: {label} {before.get(label, 0.0):.0%} -> {now.get(label, 0.0):.0%} of detections"
    elif most == "confidence":
        before_c, now_c = _mean(baseline.confidence, _conf_centre), _mean(current.confidence, _conf_centre)
        changed = f"confidence: mean {before_c:.2f} -> {now_c:.2f}"
    elif most == "area":
        changed = (
            f"box sizes: mean {_mean(baseline.area, _area_centre):.2%} -> {_mean(current.area, _area_centre):.2%} "
            "of the frame"
        )
    else:
        changed = f"detections per minute: {baseline.per_minute:.1f} -> {current.per_minute:.1f}"
    score = parts[most]
    r = {k: round(v, 4) for k, v in parts.items()}
    return DriftScore(round(score, 4), r["classes"], r["confidence"], r["area"], r["rate"], changed)


def _shares(classes: Mapping[str, int]) -> dict[str, float]:
    total = sum(classes.values())
    return {k: n / total for k, n in classes.items()} if total else {}


@dataclass
class Baseline:
    """A version's baseline: its `version` key, the `summary` so far, and whether it is complete."""

    version: str
    summary: Summary = field(default_factory=Summary)
    complete: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "complete": self.complete, "summary": self.summary.to_json()}

    @staticmethod
    def from_json(data: object) -> Baseline:
        """`to_json`'s document back; `ValueError` for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, got {type(data).__name__}")
        version, complete = data.get("version"), data.get("complete")
        if not isinstance(version, str) or not 0 < len(version) <= 128:
            raise ValueError(f"version: expected a version key, got {version!r:.40}")
        if not isinstance(complete, bool):
            raise ValueError(f"complete: expected true or false, got {complete!r:.40}")
        return Baseline(version, Summary.from_json(data.get("summary")), complete)


@dataclass
class _Bucket:
    start: float
    summary: Summary = field(default_factory=Summary)


class DriftTracker:
    """One camera under one version: the baseline over its first `baseline_s` seconds covered,
    the current window over the last `window_s` seconds of `clock` (module docstring)."""

    def __init__(
        self,
        baseline: Baseline,
        baseline_s: float,
        window_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.baseline, self.baseline_s, self.window_s, self._clock = baseline, baseline_s, window_s, clock
        self._buckets: deque[_Bucket] = deque()
        self._last: float | None = None  # the clock at the last inferred frame (this process)
        self._lock = threading.Lock()
        #: the window's buckets begun so far: a score cached at one count holds until the next
        self.buckets_begun = 0

    def add(self, labels: Sequence[str], scores: npt.NDArray[Any], shares: npt.NDArray[Any]) -> bool:
        """One inferred frame's detections; True when the baseline changed (to be saved)."""
        now = self._clock()
        gap = 0.0 if self._last is None else now - self._last
        self._last = now
        with self._lock:
            self._expire(now)
            if not self._buckets or now - self._buckets[-1].start >= self.window_s / WINDOW_BUCKETS:
                self._buckets.append(_Bucket(now))
                self.buckets_begun += 1
            self._buckets[-1].summary.add(labels, scores, shares, gap)
            if self.baseline.complete:
                return False
            self.baseline.summary.add(labels, scores, shares, gap)
            self.baseline.complete = self.baseline.summary.seconds >= self.baseline_s
            return True

    def _expire(self, now: float) -> None:
        while self._buckets and now - self._buckets[0].start > self.window_s:
            self._buckets.popleft()

    def current(self) -> Summary:
        """The window as it stands now."""
        total = Summary()
        with self._lock:
            self._expire(self._clock())
            for bucket in self._buckets:
                total.merge(bucket.summary)
        return total

    def report(self) -> DriftScore | None:
        """The score now; None while the baseline is being captured or the window is too short."""
        current = self.current()
        if not self.baseline.complete or current.seconds < WINDOW_MIN_SHARE * self.window_s:
            return None
        return compare(self.baseline.summary, current)  # a complete baseline no longer changes


@dataclass(frozen=True)
class CameraDrift:
    """One camera's drift now: the `version` its baseline is of (None before its first inferred
    frame), the seconds that baseline covered, whether it is complete, the `score` (None while
    the baseline or the window is too short) and the camera's `threshold`."""

    camera: str
    version: str | None
    baseline_s: float
    complete: bool
    score: DriftScore | None
    threshold: float

    @property
    def drifted(self) -> bool:
        return self.score is not None and self.score.score >= self.threshold
