"""Motion on one camera's frames: `MotionDetector` turns a BGR frame into a frozen `Motion`.

Each frame is reduced to a small grey copy (`MotionSettings.width` pixels wide, the aspect kept,
a 5x5 Gaussian blur), compared with a background model, thresholded (`threshold` grey levels),
masked (`masks`: polygons in frame pixels that move but do not matter, an on-screen clock, trees),
dilated, and cut into contours of at least `min_area` frame pixels whose boxes, where they lie
within a few pixels of each other, are merged into regions (at most `MAX_REGIONS`, the largest
kept). Regions are returned in frame pixels.

A frame that came as JPEG (`pipelines.sources.frames.JpegImage`, an MJPG file or camera) is
judged on a reduced decode instead: libjpeg's DCT scaling gives its grey picture at 1/8, 1/4 or
1/2 of its size (the smallest that is still `width` wide), which is shrunk and blurred as above;
its full picture is never decoded here. The small grey frame is the same to within a grey level
or two (the decoder's own rounding), so the decisions are the same (tests/pipelines/
test_motion.py compares both on rendered clips).

The background is a running average (``cv2.accumulateWeighted``, `learning_rate` per frame), not
MOG2. Measured on this development machine (AMD EPYC, one OpenCV thread, 300 frames of
testkit.motion_clips' still scene at 1280x720, an object crossing part of them): `detect` costs
0.63-0.69 ms per 720p frame, of which 0.57 ms is the grey copy (conversion, resize, blur), and
MOG2 on the same small frame with the same contours 1.17-1.22 ms, nearly twice. The running
average also keeps one float image per camera rather than a mixture of Gaussians per pixel, and
its one knob means the same on every camera; what MOG2 adds (backgrounds with several modes:
waving trees) the masks cover.

A global change (more than `global_change` of the unmasked pixels changed at once: lights
switched, auto-exposure, IR mode) is no motion: the background is reset to the frame, so the
next frames compare against the new lighting, and the `Motion` says ``recalibrated``. The first
frame (and the first after a change of frame size) only initialises the background.

Threads: not thread-safe; one camera's thread calls its own detector. No global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np
import numpy.typing as npt

from pipelines.sources.frames import JpegImage

#: most regions one frame reports (the largest kept)
MAX_REGIONS = 16
#: most contours considered before merging (the largest kept): bounds the work on a noisy frame
MAX_CONTOURS = 64
#: boxes closer than this many small-frame pixels are merged into one region
MERGE_GAP = 8
#: the blur's kernel on the small frame, pixels
BLUR = (5, 5)

Polygon = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class MotionSettings:
    """One camera's detector settings (agent.yaml's ``cameras[].motion``). `width`: pixels of
    the small grey frame; `threshold`: grey levels (0-255) a pixel must differ from the
    background by; `min_area`: least area of a moving blob, frame pixels; `learning_rate`: the
    background's weight of each new frame (0-1]; `global_change`: the fraction (0-1] of unmasked
    pixels changed at once that is a lighting change rather than motion; `masks`: polygons in
    frame pixels ignored."""

    width: int = 320
    threshold: int = 25
    min_area: int = 400
    learning_rate: float = 0.05
    global_change: float = 0.5
    masks: tuple[Polygon, ...] = ()

    def __post_init__(self) -> None:
        if not 16 <= self.width <= 4096:
            raise ValueError(f"width: expected 16..4096 pixels, got {self.width}")
        if not 1 <= self.threshold <= 255:
            raise ValueError(f"threshold: expected 1..255 grey levels, got {self.threshold}")
        if self.min_area < 1:
            raise ValueError(f"min_area: expected at least 1 pixel, got {self.min_area}")
        if not 0 < self.learning_rate <= 1:
            raise ValueError(f"learning_rate: expected (0, 1], got {self.learning_rate}")
        if not 0 < self.global_change <= 1:
            raise ValueError(f"global_change: expected (0, 1], got {self.global_change}")
        short = [i for i, polygon in enumerate(self.masks) if len(polygon) < 3]
        if short:
            raise ValueError(f"masks[{short[0]}]: expected at least 3 points, got {len(self.masks[short[0]])}")


def _no_regions() -> npt.NDArray[np.float32]:
    return np.zeros((0, 4), np.float32)


@dataclass(frozen=True, eq=False)
class Motion:
    """What moved in one frame: `regions` ``(n, 4) float32`` xyxy in frame pixels (n <=
    `MAX_REGIONS`, largest first); `changed` the fraction (0..1) of unmasked pixels that differ
    from the background; `recalibrated` when this frame was a global change (its regions empty).
    Compared by identity (it holds an array)."""

    regions: npt.NDArray[np.float32] = field(default_factory=_no_regions)
    changed: float = 0.0
    recalibrated: bool = False

    def __post_init__(self) -> None:
        regions = np.asarray(self.regions, np.float32)
        if regions.ndim != 2 or regions.shape[1] != 4:
            raise ValueError(f"regions: expected (_, 4), got {regions.shape}")
        if not 0.0 <= self.changed <= 1.0:
            raise ValueError(f"changed: expected 0..1, got {self.changed}")
        regions = regions.copy()
        regions.setflags(write=False)
        object.__setattr__(self, "regions", regions)

    @property
    def moving(self) -> bool:
        """Something moved: at least one region (never on a recalibrated frame)."""
        return len(self.regions) > 0 and not self.recalibrated


def _near(a: tuple[int, int, int, int], b: tuple[int, int, int, int], gap: int, side: int) -> bool:
    if a[0] - gap <= b[2] and b[0] - gap <= a[2] and a[1] - gap <= b[3] and b[1] - gap <= a[3]:
        return True
    return max(a[2], b[2]) - min(a[0], b[0]) <= side and max(a[3], b[3]) - min(a[1], b[1]) <= side


def merge_boxes(boxes: Sequence[tuple[int, int, int, int]], gap: int, side: int = 0) -> list[tuple[int, int, int, int]]:
    """xyxy `boxes` with those closer than `gap` pixels (on both axes), or whose union fits in a
    `side` square (0: never), merged, until none are."""
    merged = list(boxes)
    changed = True
    while changed:
        changed = False
        for i in range(len(merged)):
            for j in range(i + 1, len(merged)):
                a, b = merged[i], merged[j]
                if _near(a, b, gap, side):
                    merged[i] = (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))
                    del merged[j]
                    changed = True
                    break
            if changed:
                break
    return merged


@dataclass(frozen=True)
class _Geometry:
    """Frames of `height` x `width` pixels seen at `scale` small pixels per frame pixel; `mask`
    the small frame's unmasked pixels (255) and their count, `unmasked`."""

    height: int
    width: int
    scale: float
    mask: npt.NDArray[np.uint8]
    unmasked: int

    @classmethod
    def of(cls, height: int, width: int, settings: MotionSettings) -> _Geometry:
        small_w = min(settings.width, width)
        small_h = max(1, round(height * small_w / width))
        scale = small_w / width
        mask = np.full((small_h, small_w), 255, np.uint8)
        for polygon in settings.masks:
            points = np.round(np.asarray(polygon, np.float64) * scale).astype(np.int32)
            cv2.fillPoly(mask, [points], 0)
        return cls(height, width, scale, mask, int(cv2.countNonZero(mask)))


class MotionDetector:
    """One camera's motion: `detect(frame)` per frame, in order. Not thread-safe."""

    def __init__(self, settings: MotionSettings | None = None) -> None:
        self.settings = settings or MotionSettings()
        self._geometry: _Geometry | None = None
        self._background: npt.NDArray[np.float32] | None = None
        self._kernel = np.ones((3, 3), np.uint8)

    @staticmethod
    def _small(grey: npt.NDArray[np.uint8], geometry: _Geometry) -> npt.NDArray[np.uint8]:
        """`grey`, the frame in grey at any scale, at the small frame's size, blurred."""
        small_h, small_w = geometry.mask.shape
        if grey.shape != (small_h, small_w):
            grey = np.asarray(cv2.resize(grey, (small_w, small_h), interpolation=cv2.INTER_AREA), np.uint8)
        return np.asarray(cv2.GaussianBlur(grey, BLUR, 0), np.uint8)

    def _geometry_of(self, height: int, width: int) -> _Geometry:
        geometry = self._geometry
        if geometry is None or (geometry.height, geometry.width) != (height, width):
            geometry = self._geometry = _Geometry.of(height, width, self.settings)
            self._background = None
        return geometry

    def detect(self, frame: npt.NDArray[np.uint8] | JpegImage) -> Motion:
        """The motion in `frame`, a BGR ``(H, W, 3) uint8`` image or a JPEG (judged on its
        reduced decode, never decoded whole), against the frames before it."""
        if isinstance(frame, JpegImage):
            geometry = self._geometry_of(frame.height, frame.width)
            return self._judge(self._small(frame.grey(geometry.mask.shape[1]), geometry), geometry)
        if not isinstance(frame, np.ndarray) or frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            shape = getattr(frame, "shape", None)
            raise ValueError(f"frame: expected (H, W, 3) uint8, got {shape} {getattr(frame, 'dtype', type(frame))}")
        height, width = frame.shape[:2]
        if height < 1 or width < 1:
            raise ValueError(f"frame: expected (H, W, 3) uint8 with H, W >= 1, got {frame.shape}")
        geometry = self._geometry_of(height, width)
        grey = np.asarray(cv2.cvtColor(frame, cv2.COLOR_BGR2GRAY), np.uint8)
        return self._judge(self._small(grey, geometry), geometry)

    def _judge(self, grey: npt.NDArray[np.uint8], geometry: _Geometry) -> Motion:
        """The motion in `grey`, the small blurred frame, against the background; learns it."""
        if self._background is None:
            self._background = grey.astype(np.float32)
            return Motion()
        diff = cv2.absdiff(grey, cv2.convertScaleAbs(self._background))
        _, over = cv2.threshold(diff, self.settings.threshold, 255, cv2.THRESH_BINARY)
        binary = np.asarray(cv2.bitwise_and(over, geometry.mask), np.uint8)
        changed = cv2.countNonZero(binary) / geometry.unmasked if geometry.unmasked else 0.0
        if changed > self.settings.global_change:
            self._background = grey.astype(np.float32)
            return Motion(changed=changed, recalibrated=True)
        cv2.accumulateWeighted(grey, self._background, self.settings.learning_rate)
        return Motion(self._regions(binary, geometry), changed=changed)

    def _regions(self, binary: npt.NDArray[np.uint8], geometry: _Geometry) -> npt.NDArray[np.float32]:
        """The merged boxes of `binary`'s blobs, in frame pixels, largest first."""
        if not cv2.countNonZero(binary):
            return _no_regions()
        dilated = cv2.dilate(binary, self._kernel, iterations=2)
        contours, _ = cv2.findContours(dilated, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        least = self.settings.min_area * geometry.scale * geometry.scale
        areas = sorted(((cv2.contourArea(c), c) for c in contours), key=lambda pair: -pair[0])
        boxes = []
        for area, contour in areas[:MAX_CONTOURS]:
            if area < least:
                break
            x, y, w, h = cv2.boundingRect(contour)
            boxes.append((x, y, x + w, y + h))
        if not boxes:
            return _no_regions()
        merged = merge_boxes(boxes, MERGE_GAP)
        merged.sort(key=lambda b: -(b[2] - b[0]) * (b[3] - b[1]))
        regions = np.asarray(merged[:MAX_REGIONS], np.float32)
        regions /= np.float32(geometry.scale)
        regions[:, 0::2] = np.clip(regions[:, 0::2], 0, geometry.width)
        regions[:, 1::2] = np.clip(regions[:, 1::2], 0, geometry.height)
        return regions
