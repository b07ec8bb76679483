"""A synthetic camera: coloured circles, squares and triangles moving over a textured background,
with the exact ground truth of every shape in every frame: its box, its rotated box, a
triangle's three vertices and, when asked for, the pixels of it left visible (its mask).

Frame ``i`` of a scene is a pure function of ``(seed, i)``: shapes bounce off the frame edges
along straight lines and spin at constant speed, so any frame can be rendered directly and two
runs with the same seed give identical pixels. Later shapes are drawn over earlier ones, so
shapes overlap; each ground-truth entry carries the fraction of the shape left visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections
from pipelines.sources.frames import GroundTruth

CLASS_NAMES = ("circle", "square", "triangle")


@dataclass(frozen=True)
class _Shape:
    kind: int  # index into CLASS_NAMES
    size: float  # circumscribed diameter in pixels
    position: tuple[float, float]  # centre at frame 0
    velocity: tuple[float, float]  # pixels per frame
    angle: float  # radians at frame 0
    spin: float  # radians per frame
    color: tuple[int, int, int]  # BGR


def _bounce(start: float, speed: float, t: float, low: float, high: float) -> float:
    """Position at time t of a point moving from `start` at `speed`, reflected inside [low, high]."""
    span = high - low
    if span <= 0:
        return low
    x = (start - low + speed * t) % (2 * span)
    return low + (x if x <= span else 2 * span - x)


def _vertices(kind: int, centre: tuple[float, float], size: float, angle: float) -> npt.NDArray[np.float64]:
    """Polygon vertices ``(k, 2)`` of a square (k=4) or triangle (k=3), radius size/2."""
    corners = 4 if kind == 1 else 3
    theta = angle + np.arange(corners) * 2 * np.pi / corners
    return np.stack([centre[0] + size / 2 * np.cos(theta), centre[1] + size / 2 * np.sin(theta)], axis=1)


def draw_shape(
    canvas: npt.NDArray[Any],
    kind: int,
    centre: tuple[float, float],
    size: float,
    angle: float,
    color: tuple[int, ...],
) -> tuple[float, float, float, float]:
    """Draw a filled shape (`kind` indexes `CLASS_NAMES`; `size` its circumscribed diameter in
    pixels) onto `canvas` (antialiased, subpixel); return its exact xyxy box (not clipped)."""
    cx, cy = centre
    r = size / 2
    if kind == 0:
        cv2.circle(canvas, (round(cx * 16), round(cy * 16)), round(r * 16), color, -1, cv2.LINE_AA, shift=4)
        return cx - r, cy - r, cx + r, cy + r
    points = _vertices(kind, centre, size, angle)
    cv2.fillPoly(canvas, [np.round(points * 16).astype(np.int32)], color, cv2.LINE_AA, shift=4)
    return (
        float(points[:, 0].min()),
        float(points[:, 1].min()),
        float(points[:, 0].max()),
        float(points[:, 1].max()),
    )


def rotated_box(kind: int, centre: tuple[float, float], size: float, angle: float) -> tuple[float, ...]:
    """The tight rotated box ``(cx, cy, w, h, theta)`` of a shape as `draw_shape` draws it (pixels,
    `theta` in [0, pi) the direction of side ``w``). A circle's is its square at angle 0, a
    square's is the square itself, a triangle's lies along the side opposite its first vertex."""
    r = size / 2
    if kind == 0:
        return centre[0], centre[1], size, size, 0.0
    if kind == 1:
        side = size / np.sqrt(2)
        return centre[0], centre[1], side, side, float((angle + np.pi / 4) % (np.pi / 2))
    # the box spans the base (r / 2 behind the centre) to the apex (r ahead): its centre is r / 4 ahead
    ux, uy = np.cos(angle), np.sin(angle)
    return (
        centre[0] + r / 4 * ux,
        centre[1] + r / 4 * uy,
        r * np.sqrt(3),
        1.5 * r,
        float((angle + np.pi / 2) % np.pi),
    )


def _background(width: int, height: int, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """A muted, textured background: smooth colour blobs, stripes and fine grain."""
    coarse = rng.uniform(60, 170, (6, 8, 3)).astype(np.float32)
    image = np.asarray(cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC), np.float32)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    direction = rng.uniform(0, np.pi)
    stripes = 12 * np.sin((xx * np.cos(direction) + yy * np.sin(direction)) / rng.uniform(6, 20))
    image += stripes[..., None]
    grey = image.mean(axis=2, keepdims=True)
    image = grey + 0.5 * (image - grey)  # desaturate so shapes stand out by colour
    image += rng.normal(0, 6, image.shape).astype(np.float32)
    background: npt.NDArray[np.uint8] = np.clip(image, 0, 255).astype(np.uint8)
    return background


def _saturated_color(rng: np.random.Generator) -> tuple[int, int, int]:
    hsv = np.array([[[rng.integers(0, 180), rng.integers(170, 256), rng.integers(150, 256)]]], np.uint8)
    b, g, r = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0]
    return int(b), int(g), int(r)


class SyntheticScene:
    """A seeded scene of moving shapes.

    `width`, `height`: frame size in pixels; `num_shapes`: shapes in the scene; `size_range`:
    shape diameters in pixels; `max_speed`: pixels per frame; `noise`: std of per-frame pixel
    noise. ``render(i)`` returns frame ``i`` as BGR ``(height, width, 3) uint8`` and its
    `GroundTruth`.
    """

    kind = "synthetic"  # its source string: synthetic[:SEED]

    def __init__(
        self,
        width: int = 640,
        height: int = 480,
        num_shapes: int = 5,
        seed: int = 0,
        size_range: tuple[float, float] = (40.0, 140.0),
        max_speed: float = 6.0,
        noise: float = 4.0,
    ) -> None:
        if width < 32 or height < 32:
            raise ValueError(f"synthetic frames must be at least 32x32 pixels, got {width}x{height}")
        if num_shapes < 0:
            raise ValueError(f"num_shapes must be >= 0, got {num_shapes}")
        if not 0 < size_range[0] <= size_range[1] < min(width, height):
            raise ValueError(f"size_range {size_range} must be positive and fit in {width}x{height}")
        self.width, self.height, self.seed = width, height, seed
        rng = np.random.default_rng(seed)
        self._background = _background(width, height, rng)
        # Per-frame grain from a small bank (signed noise as a BGR offset around 0; int8 holds it:
        # 0.9 MB a frame instead of 1.8 MB as int16, for the same pixels).
        self._grain = [
            np.clip(rng.normal(0, noise, (height, width, 3)), -127, 127).astype(np.int8)
            for _ in range(4 if noise > 0 else 0)
        ]
        self._shapes = []
        for _ in range(num_shapes):
            size = float(rng.uniform(*size_range))
            speed, heading = rng.uniform(0.5, max_speed), rng.uniform(0, 2 * np.pi)
            self._shapes.append(
                _Shape(
                    kind=int(rng.integers(len(CLASS_NAMES))),
                    size=size,
                    position=(
                        float(rng.uniform(size / 2, width - size / 2)),
                        float(rng.uniform(size / 2, height - size / 2)),
                    ),
                    velocity=(float(speed * np.cos(heading)), float(speed * np.sin(heading))),
                    angle=float(rng.uniform(0, 2 * np.pi)),
                    spin=float(rng.uniform(-0.05, 0.05)),
                    color=_saturated_color(rng),
                )
            )

    def _pose(self, shape: _Shape, t: int) -> tuple[tuple[float, float], float]:
        """Centre (pixels) and angle (radians) of `shape` at frame t."""
        r = shape.size / 2
        cx = _bounce(shape.position[0], shape.velocity[0], t, r, self.width - r)
        cy = _bounce(shape.position[1], shape.velocity[1], t, r, self.height - r)
        return (cx, cy), shape.angle + shape.spin * t

    def _draw(self, canvas: npt.NDArray[Any], shape: _Shape, t: int, color: tuple[int, ...]) -> tuple[float, ...]:
        """Draw `shape` at frame t onto `canvas`; return its exact xyxy box."""
        centre, angle = self._pose(shape, t)
        return draw_shape(canvas, shape.kind, centre, shape.size, angle, color)

    def render(self, index: int, masks: bool = False) -> tuple[npt.NDArray[np.uint8], GroundTruth]:
        """Frame `index` (>= 0) and its ground truth; with `masks`, each shape's visible pixels too."""
        image = self._background.copy()
        boxes = [self._draw(image, shape, index, shape.color) for shape in self._shapes]
        if self._grain:
            image = np.asarray(cv2.add(image, self._grain[index % len(self._grain)], dtype=cv2.CV_8U), np.uint8)
        truth = Detections.from_arrays(
            np.clip(np.array(boxes, np.float32).reshape(-1, 4), 0, [self.width, self.height, self.width, self.height]),
            np.ones(len(self._shapes), np.float32),
            [s.kind for s in self._shapes],
        )
        ids = np.arange(len(self._shapes), dtype=np.int32)
        visible, keypoints, shown = self._visible(index)
        poses = [self._pose(s, index) for s in self._shapes]
        obb = np.array(
            [
                rotated_box(s.kind, centre, s.size, angle)
                for s, (centre, angle) in zip(self._shapes, poses, strict=True)
            ],
            np.float32,
        ).reshape(-1, 5)
        return image, GroundTruth(truth, visible, ids, obb, keypoints, shown if masks else None)

    def _visible(self, index: int) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """Per shape: the fraction of its area not covered by the shapes drawn after it, its
        keypoints ``(n, 3, 3)`` (a triangle's vertices with their visibility) and its visible mask."""
        n = len(self._shapes)
        masks = np.zeros((n, self.height, self.width), np.uint8)
        for i, shape in enumerate(self._shapes):
            self._draw(masks[i], shape, index, (1,))
        visible = np.ones(n, np.float32)
        keypoints = np.zeros((n, 3, 3), np.float32)
        shown = np.zeros((n, self.height, self.width), bool)
        covered = np.zeros((self.height, self.width), np.uint8)
        for i in range(n - 1, -1, -1):  # top-most shape first
            own = cv2.subtract(masks[i], covered)
            area = cv2.countNonZero(masks[i])
            if area:
                visible[i] = cv2.countNonZero(own) / area
            shown[i] = own > 0
            shape = self._shapes[i]
            if shape.kind == 2:
                centre, angle = self._pose(shape, index)
                vertices = _vertices(2, centre, shape.size, angle)
                col = np.clip(np.round(vertices[:, 0]).astype(int), 0, self.width - 1)
                row = np.clip(np.round(vertices[:, 1]).astype(int), 0, self.height - 1)
                keypoints[i, :, :2] = vertices
                keypoints[i, :, 2] = covered[row, col] == 0
            covered |= masks[i]
        return visible, keypoints, shown
