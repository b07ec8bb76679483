"""Camera health: whether one camera still sees its scene, judged on small grey copies of its frames.

`CameraHealth.observe(frame, now)` takes a BGR ``(H, W, 3) uint8`` frame with its capture time
(`now`, seconds of a monotonic clock, never read here) and returns a `HealthReport`: the problems
held long enough and the numbers behind them. Each frame is reduced to a grey copy `width` pixels
wide (aspect kept, at least 16 rows) and judged for

- **frozen**: near-identical to the frame before (mean absolute difference below `frozen_diff`
  grey levels) for `frozen_s`; the caller feeds only frames of a running source;
- **dark**, **overexposed**: mean luminance below `dark_luma` or above `bright_luma`; also
  overexposed when more than half the picture is brighter than `bright_luma` (the sun washing out
  a scene whose dark part keeps the mean down);
- **low_contrast**: luminance spread (standard deviation) below `min_contrast`;
- **defocused** (defocus, fog): sharpness (variance of the Laplacian of the frame normalised to
  unit spread, so brightness does not change it) below `defocus_fraction` of the camera's own
  baseline, the median of its last `baseline_frames` good frames;
- **covered**: spread and edge energy both below `covered_fraction` of their baselines at once (a
  slow fall is followed by the baseline, so only a sudden loss reads as covered);
- **moved**: shifted by more than `moved_fraction` of the width or turned by more than
  `moved_degrees` against the reference image (`pipelines.camera_moved`), a copy of a frame taken
  once the camera has been good for `reference_after_s` (and again every `reference_after_s` while
  it stays good), or the next frame after `reset_reference()`. Both are normalised first: dusk or
  a light switched on moves nothing.

Every kind but frozen must hold for `hold_s` before it is a problem (a passing truck is not one);
a problem clears on the first frame without its condition. A dark or overexposed frame is judged
for nothing else (a lens covered by something black reads as dark); a covered one is not also
low in contrast, defocused or moved.

Cost (`bench/camera_health.py`: CPU time of `observe` on one OpenCV thread, the development VM,
median of 400 frames): 1.8 ms for a 1280x720 frame and 2.6 ms for 1920x1080, so at the default
rate of one frame every `interval_s` = 1 s, 0.18 % and 0.26 % of a core (goal: under 2 %).

Threads: one camera's thread calls `observe` and `reset_reference`; not thread-safe. No global
state: each camera has its own `CameraHealth`.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, fields
from typing import Literal

import cv2
import numpy as np
import numpy.typing as npt

from pipelines.camera_moved import MotionMeter, normalise

ProblemKind = Literal["frozen", "dark", "overexposed", "low_contrast", "defocused", "covered", "moved"]
#: the kinds, in the order a report lists them
KINDS: tuple[ProblemKind, ...] = ("frozen", "dark", "overexposed", "low_contrast", "defocused", "covered", "moved")
#: good frames a baseline needs before defocus and covered are judged
MIN_BASELINE = 10
#: a picture with more than this share of its pixels above `bright_luma` is overexposed
WASHED_OUT_SHARE = 0.5


@dataclass(frozen=True)
class HealthThresholds:
    """When a camera has a problem. Seconds of the frames' clock; grey levels 0..255.
    `interval_s` is for the caller (how often it feeds a frame); `CameraHealth` reads only `now`."""

    interval_s: float = 1.0  # the caller's rate: one frame every interval_s
    width: int = 160  # pixels of the grey copy judged
    frozen_s: float = 30.0  # near-identical frames this long: frozen
    frozen_diff: float = 0.1  # mean absolute difference below this: near-identical
    hold_s: float = 10.0  # every other condition holds this long before it is a problem
    dark_luma: float = 35.0  # mean luminance below: dark
    bright_luma: float = 220.0  # mean luminance above: overexposed
    min_contrast: float = 8.0  # luminance spread (std) below: low contrast
    defocus_fraction: float = 0.5  # sharpness below this share of the baseline: defocused
    covered_fraction: float = 0.25  # spread and edges below this share of their baselines: covered
    baseline_frames: int = 120  # good frames whose median is the baseline
    moved_fraction: float = 0.05  # a shift above this share of the width: moved
    moved_degrees: float = 3.0  # a rotation above this: moved
    reference_after_s: float = 60.0  # good this long: the frame becomes the reference

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{item.name} must be a finite number >= 0, got {value}")
        positive = ("interval_s", "frozen_s", "frozen_diff", "defocus_fraction", "covered_fraction")
        for name in (*positive, "moved_fraction", "moved_degrees"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("defocus_fraction", "covered_fraction", "moved_fraction"):
            if getattr(self, name) >= 1:
                raise ValueError(f"{name} must be below 1, got {getattr(self, name)}")
        if not 32 <= self.width <= 640:
            raise ValueError(f"width must be 32..640 pixels, got {self.width}")
        if self.dark_luma >= self.bright_luma or self.bright_luma > 255:
            raise ValueError(f"dark_luma ({self.dark_luma}) must be below bright_luma ({self.bright_luma}) <= 255")
        if self.moved_degrees >= 90:
            raise ValueError(f"moved_degrees must be below 90, got {self.moved_degrees}")
        if self.baseline_frames < MIN_BASELINE:
            raise ValueError(f"baseline_frames must be >= {MIN_BASELINE}, got {self.baseline_frames}")


@dataclass(frozen=True)
class CameraProblem:
    """A problem held long enough: its `kind`, `since` (the clock's seconds its condition began) and
    `detail` (the numbers, for a person)."""

    kind: ProblemKind
    since: float
    detail: str


@dataclass(frozen=True)
class HealthReport:
    """One frame judged. `problems` in `KINDS` order; `luminance` and `contrast` (its std) in grey
    levels; `sharpness` and `baseline_sharpness` (None until `MIN_BASELINE` good frames) the
    normalised Laplacian variance; `difference` the mean absolute difference from the frame before
    (None for the first); `shift_px` (pixels of the grey copy) and `rotation_deg` against the
    reference (0 without one); `reference` the grey copy ``(h, width) uint8`` kept as the
    reference, or None."""

    problems: tuple[CameraProblem, ...]
    luminance: float
    contrast: float
    sharpness: float
    baseline_sharpness: float | None
    difference: float | None
    shift_px: float
    rotation_deg: float
    reference: npt.NDArray[np.uint8] | None

    @property
    def kinds(self) -> tuple[ProblemKind, ...]:
        return tuple(problem.kind for problem in self.problems)


def _median(values: deque[float]) -> float | None:
    return statistics.median(values) if len(values) >= MIN_BASELINE else None


class CameraHealth:
    """One camera's health over its frames (see the module's docstring). Not thread-safe."""

    def __init__(self, thresholds: HealthThresholds | None = None) -> None:
        self.thresholds = thresholds or HealthThresholds()
        size = self.thresholds.baseline_frames
        self._sharpness: deque[float] = deque(maxlen=size)
        self._contrast: deque[float] = deque(maxlen=size)
        self._edges: deque[float] = deque(maxlen=size)
        self._since: dict[ProblemKind, float] = {}  # when each present condition began
        self._previous: npt.NDArray[np.float32] | None = None
        self._meter: MotionMeter | None = None
        self._reference: tuple[npt.NDArray[np.uint8], npt.NDArray[np.float32]] | None = None
        self._take_reference = False
        self._good_since: float | None = None
        self._last_now = -math.inf

    def reset_reference(self) -> None:
        """The next frame observed becomes the reference (the camera's new normal view): "moved"
        clears with it."""
        self._reference = None
        self._take_reference = True

    def _grey(self, frame: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8 or min(frame.shape[:2]) < 16:
            raise ValueError(f"expected a BGR frame (H>=16, W>=16, 3) uint8, got {frame.shape} {frame.dtype}")
        height, width = frame.shape[:2]
        size = (self.thresholds.width, max(16, round(height * self.thresholds.width / width)))
        small = cv2.resize(frame, size, interpolation=cv2.INTER_AREA)
        return np.asarray(cv2.cvtColor(small, cv2.COLOR_BGR2GRAY), np.uint8)

    def observe(self, frame: npt.NDArray[np.uint8], now: float) -> HealthReport:
        """Judge `frame` (BGR ``(H, W, 3) uint8``) captured at `now` (seconds, never decreasing)."""
        if not math.isfinite(now) or now < self._last_now:
            raise ValueError(f"now must be finite and never decrease, got {now} after {self._last_now}")
        self._last_now = now
        t = self.thresholds
        grey8 = self._grey(frame)
        grey8.flags.writeable = False  # it may become the reference a report hands out
        grey = grey8.astype(np.float32)
        if self._meter is None or self._previous is None or self._previous.shape != grey.shape:
            self._meter, self._previous, self._reference = MotionMeter(*grey.shape), None, None
        mean, std = cv2.meanStdDev(grey)
        luminance, contrast = float(mean[0, 0]), float(std[0, 0])
        flat = normalise(grey)
        sharpness = float(cv2.Laplacian(flat, cv2.CV_32F).var())
        edges = sharpness * contrast**2  # the Laplacian's variance before normalising
        difference = None if self._previous is None else float(cv2.norm(grey, self._previous, cv2.NORM_L1) / grey.size)
        self._previous = grey
        base_sharpness, base_contrast, base_edges = map(_median, (self._sharpness, self._contrast, self._edges))

        present: dict[ProblemKind, str] = {}
        if difference is not None and difference < t.frozen_diff:
            present["frozen"] = f"frames differ by {difference:.3f} grey levels (< {t.frozen_diff})"
        if luminance < t.dark_luma:
            present["dark"] = f"mean luminance {luminance:.0f} (< {t.dark_luma:.0f})"
        elif luminance > t.bright_luma:
            present["overexposed"] = f"mean luminance {luminance:.0f} (> {t.bright_luma:.0f})"
        elif (washed := np.count_nonzero(grey8 > t.bright_luma) / grey8.size) > WASHED_OUT_SHARE:
            present["overexposed"] = f"{washed:.0%} of the picture brighter than {t.bright_luma:.0f}"
        else:
            if (
                base_contrast is not None
                and base_edges is not None
                and contrast < t.covered_fraction * base_contrast
                and edges < t.covered_fraction * base_edges
            ):
                present["covered"] = (
                    f"spread {contrast:.1f} and edges {edges:.0f} (baselines {base_contrast:.1f}, {base_edges:.0f})"
                )
            else:
                if contrast < t.min_contrast:
                    present["low_contrast"] = f"luminance spread {contrast:.1f} (< {t.min_contrast})"
                if base_sharpness is not None and sharpness < t.defocus_fraction * base_sharpness:
                    present["defocused"] = (
                        f"sharpness {sharpness:.2f}, {sharpness / base_sharpness:.0%} of its baseline"
                    )

        shift = rotation = 0.0
        if self._take_reference:
            self._reference, self._take_reference = (grey8, flat), False
        elif self._reference is not None and not ({"dark", "overexposed", "covered", "low_contrast"} & present.keys()):
            motion = self._meter.measure(self._reference[1], flat)
            shift, rotation = motion.shift, motion.rotation_deg
            if shift > t.moved_fraction * grey.shape[1] or abs(rotation) > t.moved_degrees:
                present["moved"] = f"shifted {shift / grey.shape[1]:.1%} of the width, turned {rotation:.1f} degrees"

        for kind in [k for k in self._since if k not in present]:
            del self._since[kind]
        problems = []
        for kind in KINDS:
            if kind in present:
                since = self._since.setdefault(kind, now)
                if now - since >= (t.frozen_s if kind == "frozen" else t.hold_s):
                    problems.append(CameraProblem(kind, since, present[kind]))

        if present:
            self._good_since = None
        else:
            self._sharpness.append(sharpness)
            self._contrast.append(contrast)
            self._edges.append(edges)
            self._good_since = now if self._good_since is None else self._good_since
            if now - self._good_since >= t.reference_after_s:
                self._reference, self._good_since = (grey8, flat), now
        return HealthReport(
            problems=tuple(problems),
            luminance=luminance,
            contrast=contrast,
            sharpness=sharpness,
            baseline_sharpness=base_sharpness,
            difference=difference,
            shift_px=shift,
            rotation_deg=rotation,
            reference=None if self._reference is None else self._reference[0],
        )
