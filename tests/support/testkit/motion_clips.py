"""Clips for motion detection, rendered frame by frame and seeded: a still textured scene with
sensor noise, objects that enter, stop and leave, a lighting change, and a busy scene.

A `MotionClip` draws, per frame, its background texture (noise blurred into blotches, fixed per
seed), each `Mover` visible at that frame (a filled rectangle moved along its keyframes), then
multiplies the whole frame by `light_gain` from frame `light_at` on (lights switched on), adds
Gaussian sensor noise (`noise_sigma` grey levels, drawn anew per frame) and clips to 0..255.
`boxes(i)` are the true xyxy boxes (frame pixels) of the movers visible in frame `i`. A mover
with a `picture` pastes that photo (resized to its size) instead of a rectangle: `far_away_scene`
walks a small photo of a person across a 1080p frame, for regions (pipelines.regions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import cv2
import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Mover:
    """A filled `size` (w, h) rectangle of `colour` (BGR) whose centre follows `keyframes`
    ((frame, x, y), frames ascending; linear between them), visible from the first keyframe's
    frame to the last's. A keyframe repeated at a later frame is a stop. `blink`: the colour
    alternates with its inverse every frame (an on-screen clock's digits). `picture`: a BGR
    ``(h, w, 3) uint8`` photo pasted, resized to `size`, in place of the rectangle."""

    keyframes: tuple[tuple[int, float, float], ...]
    size: tuple[int, int] = (60, 120)
    colour: tuple[int, int, int] = (40, 200, 230)
    blink: bool = False
    picture: npt.NDArray[np.uint8] | None = field(default=None, compare=False)

    def box(self, index: int) -> tuple[float, float, float, float] | None:
        frames = [k[0] for k in self.keyframes]
        if not frames[0] <= index <= frames[-1]:
            return None
        x = float(np.interp(index, frames, [k[1] for k in self.keyframes]))
        y = float(np.interp(index, frames, [k[2] for k in self.keyframes]))
        w, h = self.size
        return (x - w / 2, y - h / 2, x + w / 2, y + h / 2)


@dataclass(frozen=True)
class MotionClip:
    """`width` x `height` BGR frames of a textured scene with `movers` (see the module)."""

    width: int = 640
    height: int = 360
    seed: int = 0
    movers: tuple[Mover, ...] = ()
    light_at: int | None = None
    light_gain: float = 1.4
    noise_sigma: float = 3.0

    def texture(self) -> npt.NDArray[np.float32]:
        """The still scene: blotches of grey-brown, mean about 110, spread about 30 levels."""
        rng = np.random.default_rng(self.seed)
        coarse = rng.normal(0, 1, (self.height // 8 + 1, self.width // 8 + 1, 3)).astype(np.float32)
        fine = cv2.resize(coarse, (self.width, self.height), interpolation=cv2.INTER_CUBIC)
        fine = cv2.GaussianBlur(fine, (0, 0), 3)
        fine = (fine - fine.mean()) / (fine.std() + 1e-6)
        return np.asarray(110 + 30 * fine, np.float32)

    def boxes(self, index: int) -> npt.NDArray[np.float32]:
        """``(n, 4) float32`` xyxy of the movers visible in frame `index`, clipped to the frame
        (those wholly outside it left out)."""
        found = [b for m in self.movers if (b := m.box(index)) is not None]
        boxes = np.asarray(found, np.float32).reshape(-1, 4)
        boxes[:, 0::2] = np.clip(boxes[:, 0::2], 0, self.width)
        boxes[:, 1::2] = np.clip(boxes[:, 1::2], 0, self.height)
        return boxes[(boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])]

    def frame(self, index: int, texture: npt.NDArray[np.float32] | None = None) -> npt.NDArray[np.uint8]:
        """Frame `index` (pass `texture()` to save drawing it again)."""
        image = (self.texture() if texture is None else texture).copy()
        for mover in self.movers:
            box = mover.box(index)
            if box is None:
                continue
            colour = tuple(255 - c for c in mover.colour) if mover.blink and index % 2 else mover.colour
            x0, y0, x1, y1 = (round(v) for v in box)
            if mover.picture is not None:
                self._paste(image, np.asarray(cv2.resize(mover.picture, mover.size), np.uint8), x0, y0)
                continue
            cv2.rectangle(image, (x0, y0), (x1, y1), tuple(float(c) for c in colour), thickness=-1)
        if self.light_at is not None and index >= self.light_at:
            image *= self.light_gain
        noise = np.random.default_rng((self.seed, index)).normal(0, self.noise_sigma, image.shape)
        return np.asarray(np.clip(image + noise, 0, 255), np.uint8)

    @staticmethod
    def _paste(image: npt.NDArray[np.float32], picture: npt.NDArray[np.uint8], x0: int, y0: int) -> None:
        """`picture` onto `image` with its top-left corner at (`x0`, `y0`), cut at the frame's edges."""
        h, w = image.shape[:2]
        ph, pw = picture.shape[:2]
        left, top, right, bottom = max(0, x0), max(0, y0), min(w, x0 + pw), min(h, y0 + ph)
        if right > left and bottom > top:
            image[top:bottom, left:right] = picture[top - y0 : bottom - y0, left - x0 : right - x0]

    def frames(self, count: int) -> list[npt.NDArray[np.uint8]]:
        texture = self.texture()
        return [self.frame(i, texture) for i in range(count)]


def still_scene(width: int = 640, height: int = 360, seed: int = 0, light_at: int | None = None) -> MotionClip:
    """A still textured scene; one object enters from the left at frame 10, walks to the middle
    by frame 25, stops there until frame 60, and leaves to the right by frame 80."""
    w, h = round(width * 0.1), round(height * 0.35)
    y = height * 0.6
    walker = Mover(((10, -w / 2, y), (25, width / 2, y), (60, width / 2, y), (80, width + w / 2, y)), size=(w, h))
    return MotionClip(width, height, seed, (walker,), light_at=light_at)


def busy_scene(width: int = 640, height: int = 360, seed: int = 0, objects: int = 12, frames: int = 120) -> MotionClip:
    """Many objects crossing the frame all the time, in both directions, at several speeds."""
    rng = np.random.default_rng(seed)
    movers = []
    for _ in range(objects):
        w, h = int(rng.integers(width // 30, width // 10)), int(rng.integers(height // 15, height // 5))
        y0, y1 = rng.uniform(h, height - h, 2)
        start, end = (-w, width + w) if rng.random() < 0.5 else (width + w, -w)
        first = int(rng.integers(-frames // 2, frames // 2))
        span = int(rng.integers(frames // 4, frames // 2))
        b, g, r = (int(c) for c in rng.integers(0, 256, 3))
        movers.append(Mover(((first, start, y0), (first + span, end, y1)), size=(w, h), colour=(b, g, r)))
    return MotionClip(width, height, seed, tuple(movers))


def far_away_scene(
    picture: npt.NDArray[np.uint8], width: int = 1920, height: int = 1080, size: int = 144, frames: int = 40
) -> MotionClip:
    """A 1080p still scene in which `picture` (a photo of a person, `size` pixels square: a third
    of that once the frame is letterboxed into a 640 input) walks from the left third to the
    right third along the lower half, from frame 0 to `frames` - 1."""
    y = height * 0.65
    walker = Mover(((0, width * 0.3, y), (frames - 1, width * 0.7, y)), size=(size, size), picture=picture)
    return MotionClip(width, height, seed=3, movers=(walker,), noise_sigma=2.0)
