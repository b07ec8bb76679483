"""Rendered camera clips for `pipelines.camera_health`: a fixed camera's textured scene with a few
moving objects and sensor noise (`HealthScene`), or real photos seen through a camera that pans
slowly across them (`PhotoScene`), and the same clip gone wrong from frame `at` on (frozen, dark,
overexposed, blurred, covered, shifted, rotated) or changed in ways that must raise nothing (a
gradual dusk, a light switched on).

Deterministic: frame ``i`` of a clip is a pure function of ``(seed, i)``. Frames are BGR
``(height, width, 3) uint8``; a clip is an iterator of ``(frame, seconds)`` at one frame a second.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

import cv2
import numpy as np
import numpy.typing as npt

Frame = npt.NDArray[np.uint8]
#: how a variant changes frame ``i`` (>= the clip's `at`) of the normal clip
Change = Callable[[Frame, int], Frame]


class Scene(Protocol):
    """What a clip shows: frame `index` (>= 0) of a camera's view, BGR ``(h, w, 3) uint8``."""

    def render(self, index: int) -> Frame: ...


class HealthScene:
    """A fixed camera's view: a static textured background (blurred noise at three scales, a few
    blocks and lines, like walls and kerbs) with `movers` small shapes crossing it and per-frame
    sensor noise of std `noise` grey levels."""

    def __init__(self, width: int = 640, height: int = 360, seed: int = 0, movers: int = 3, noise: float = 3.0) -> None:
        self.width, self.height, self.seed, self.noise = width, height, seed, noise
        rng = np.random.default_rng(seed)
        texture = np.zeros((height, width), np.float32)
        for sigma, weight in ((1.5, 0.5), (5.0, 1.0), (18.0, 1.5)):
            layer = cv2.GaussianBlur(rng.normal(0, 1, (height, width)).astype(np.float32), (0, 0), sigma)
            texture += weight * layer / max(float(layer.std()), 1e-6)
        texture = 115 + 30 * texture / float(texture.std())
        for _ in range(6):
            x, y = int(rng.integers(0, width - 60)), int(rng.integers(0, height - 60))
            w, h = int(rng.integers(30, width // 3)), int(rng.integers(20, height // 3))
            cv2.rectangle(texture, (x, y), (x + w, y + h), float(rng.uniform(40, 200)), -1)
        for _ in range(4):
            p, q = rng.integers(0, (width, height), 2), rng.integers(0, (width, height), 2)
            cv2.line(texture, (int(p[0]), int(p[1])), (int(q[0]), int(q[1])), float(rng.uniform(30, 220)), 3)
        tint = rng.uniform(0.85, 1.15, 3).astype(np.float32)
        self._background = texture[..., None] * tint
        self._movers = [
            (
                rng.uniform(0, width, 2),  # start (x, y)
                rng.uniform(-8, 8, 2),  # pixels per frame
                float(rng.uniform(10, 25)),  # radius
                tuple(float(c) for c in rng.uniform(20, 235, 3)),  # BGR
            )
            for _ in range(movers)
        ]

    def render(self, index: int) -> Frame:
        """Frame `index` (>= 0), BGR ``(height, width, 3) uint8``."""
        image = self._background.copy()
        for start, speed, radius, colour in self._movers:
            x, y = (start + speed * index) % (self.width, self.height)
            cv2.circle(image, (int(x), int(y)), int(radius), colour, -1, cv2.LINE_AA)
        noise = np.random.default_rng((self.seed, index)).normal(0, self.noise, image.shape[:2])
        image += noise.astype(np.float32)[..., None]
        return np.asarray(np.clip(image, 0, 255), np.uint8)


class PhotoScene:
    """A camera looking at a still `photo` (BGR, larger than the view): the view, a `view`-wide
    16:9 window of it scaled to `width` x `height`, pans right by `pan_px` pixels of the photo a
    frame (a camera's mount creeping, well below anything called "moved"), with per-frame sensor
    noise of std `noise` grey levels. The window starts at the photo's left edge, centred
    vertically; a pan past the right edge stops there."""

    def __init__(
        self,
        photo: Frame,
        width: int = 640,
        height: int = 360,
        seed: int = 0,
        view: int = 864,
        pan_px: float = 0.2,
        noise: float = 3.0,
    ) -> None:
        rows, columns = photo.shape[:2]
        if view > columns or view * height / width > rows:
            raise ValueError(f"a {view}-wide window does not fit a {columns}x{rows} photo")
        self.width, self.height, self.seed, self.noise = width, height, seed, noise
        self._photo, self._view, self._pan = photo, view, pan_px
        self._top = (rows - view * height / width) / 2
        self._last_left = float(columns - view)

    def render(self, index: int) -> Frame:
        """Frame `index` (>= 0), BGR ``(height, width, 3) uint8``."""
        scale = self.width / self._view
        left = min(self._pan * index, self._last_left)
        matrix = np.array([[scale, 0, -scale * left], [0, scale, -scale * self._top]], np.float32)
        image = cv2.warpAffine(self._photo, matrix, (self.width, self.height), flags=cv2.INTER_LINEAR).astype(
            np.float32
        )
        noise = np.random.default_rng((self.seed, index)).normal(0, self.noise, image.shape[:2])
        image += noise.astype(np.float32)[..., None]
        return np.asarray(np.clip(image, 0, 255), np.uint8)


def scaled(frame: Frame, gain: float) -> Frame:
    """`frame` with every pixel times `gain` (saturating at 255)."""
    return np.asarray(cv2.convertScaleAbs(frame, alpha=gain), np.uint8)


def warped(frame: Frame, degrees: float = 0.0, shift_fraction: float = 0.0) -> Frame:
    """`frame` turned by `degrees` about its centre (counter-clockwise) and moved right by
    `shift_fraction` of its width, the edges filled by reflection (as a knocked camera sees more)."""
    height, width = frame.shape[:2]
    matrix = cv2.getRotationMatrix2D((width / 2, height / 2), degrees, 1.0)
    matrix[0, 2] += shift_fraction * width
    return np.asarray(cv2.warpAffine(frame, matrix, (width, height), borderMode=cv2.BORDER_REFLECT), np.uint8)


def covered(frame: Frame, index: int) -> Frame:
    """A cloth over the lens: a near-uniform brown with sensor noise and a faint smooth gradient."""
    height, width = frame.shape[:2]
    ramp = np.linspace(-4, 4, width, dtype=np.float32)[None, :, None]
    noise = np.random.default_rng(index).normal(0, 2, (height, width, 1)).astype(np.float32)
    return np.asarray(np.clip(np.array([70, 90, 110], np.float32) + ramp + noise, 0, 255), np.uint8)


def dusk(frames: int) -> Change:
    """Brightness falling linearly to 40 % over `frames` frames after the clip's `at`."""
    return lambda frame, i: scaled(frame, 1.0 - 0.6 * min(i / frames, 1.0))


#: each variant: how it changes a frame from the clip's `at` on (its argument: frames since `at`)
VARIANTS: dict[str, Change] = {
    "normal": lambda frame, i: frame,
    "dark": lambda frame, i: scaled(frame, 0.08),
    "overexposed": lambda frame, i: scaled(frame, 3.0),
    "blurred": lambda frame, i: np.asarray(cv2.GaussianBlur(frame, (0, 0), 3.0), np.uint8),
    "covered": covered,
    "shifted": lambda frame, i: warped(frame, shift_fraction=0.10),
    "rotated": lambda frame, i: warped(frame, degrees=5.0),
    "light_on": lambda frame, i: scaled(frame, 1.5),
}


def clip(
    variant: str,
    frames: int,
    at: int = 0,
    seed: int = 0,
    width: int = 640,
    height: int = 360,
    scene: Scene | None = None,
) -> Iterator[tuple[Frame, float]]:
    """`frames` frames of `scene` (by default the `HealthScene` of `seed`, `width` x `height`), one
    a second (``(frame, seconds)``), changed by `variant` (a key of `VARIANTS`, ``"frozen"``: frame
    `at` repeated, byte for byte, or ``"dusk"``: `dusk` over the frames after `at`) from frame `at` on."""
    scene = scene or HealthScene(width, height, seed)
    change = dusk(frames - at) if variant == "dusk" else None if variant == "frozen" else VARIANTS[variant]
    held: Frame | None = None
    for index in range(frames):
        if index < at:
            yield scene.render(index), float(index)
        elif change is None:  # a frozen decoder hands out its last picture again and again
            held = scene.render(at) if held is None else held
            yield held, float(index)
        else:
            yield change(scene.render(index), index - at), float(index)
