"""A synthetic scene for tracking: shapes that enter, cross the frame on straight paths and
leave, passing in front of and behind each other, with exact ground truth of every identity.

Objects are `Mover`s: a shape with a first and last frame and a straight path. A scene is either
scripted (a list of movers, for tests of one situation: an occlusion, a line crossing, an object
moving along a line) or drawn from a seed: movers enter from a random edge and leave by the
opposite one. Seeded scenes are endless: frames are cut into epochs of `EPOCH` frames, and the
movers of epoch ``k`` come from ``(seed, k)`` alone, so frame ``i`` is a pure function of
``(seed, i)`` like `pipelines.sources.synthetic.SyntheticScene`'s. Movers later in the list are drawn on
top; a mover's ground-truth `visible` is the fraction of its whole area that is in the frame and
not covered.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections
from pipelines.sources.frames import GroundTruth
from pipelines.sources.synthetic import CLASS_NAMES, _background, _saturated_color, draw_shape

EPOCH = 300  # frames whose movers one seed draws at once
MAX_LIFE = EPOCH  # a seeded mover lives at most this many frames, so two epochs cover any frame


@dataclass(frozen=True)
class Mover:
    """One object: `kind` indexes `CLASS_NAMES`; `size` its diameter in pixels; at frame
    `first` its centre is `start` and it moves `velocity` pixels per frame until `last`
    (inclusive); `object_id` its identity in the ground truth."""

    object_id: int
    kind: int
    size: float
    first: int
    last: int
    start: tuple[float, float]
    velocity: tuple[float, float]
    color: tuple[int, int, int]

    def centre(self, index: int) -> tuple[float, float]:
        t = index - self.first
        return self.start[0] + self.velocity[0] * t, self.start[1] + self.velocity[1] * t


def _crossing_movers(
    rng: np.random.Generator, epoch: int, count: int, width: int, height: int, max_speed: float
) -> list[Mover]:
    """`count` movers entering during `epoch` from a random edge, leaving by the opposite one."""
    movers = []
    for n in range(count):
        size = float(rng.uniform(45, 110))
        speed = float(rng.uniform(max(1.5, (width + size) / MAX_LIFE * 1.2), max_speed))
        r = size / 2
        edge = int(rng.integers(4))  # 0 left, 1 right, 2 top, 3 bottom
        across = float(rng.uniform(r, (height if edge < 2 else width) - r))
        slant = float(rng.uniform(-0.3, 0.3)) * speed
        if edge < 2:
            start = (-r if edge == 0 else width + r, across)
            velocity = (speed if edge == 0 else -speed, slant)
            life = (width + size) / speed
        else:
            start = (across, -r if edge == 2 else height + r)
            velocity = (slant, speed if edge == 2 else -speed)
            life = (height + size) / speed
        first = epoch * EPOCH + int(rng.integers(0, EPOCH - 20))
        movers.append(
            Mover(
                object_id=epoch * 1000 + n,
                kind=int(rng.integers(len(CLASS_NAMES))),
                size=size,
                first=first,
                last=first + min(int(life), MAX_LIFE - 1),
                start=start,
                velocity=velocity,
                color=_saturated_color(rng),
            )
        )
    return movers


class TrackingScene:
    """Shapes coming and going over a textured background.

    Either `movers` (scripted) or, when it is None, `per_epoch` seeded movers every `EPOCH`
    frames. ``render(i)`` returns frame ``i`` (BGR ``(height, width, 3) uint8``) and its
    `GroundTruth` with ids: the movers whose shape is in the frame, in drawing order.
    """

    kind = "tracking"  # its source string: tracking[:SEED] (or the older traffic[:SEED])

    def __init__(
        self,
        width: int = 640,
        height: int = 480,
        seed: int = 0,
        movers: list[Mover] | None = None,
        per_epoch: int = 12,
        max_speed: float = 6.0,
        noise: float = 4.0,
    ) -> None:
        self.width, self.height, self.seed = width, height, seed
        self.per_epoch, self.max_speed = per_epoch, max_speed
        rng = np.random.default_rng([seed, 1])
        self._background = _background(width, height, rng)
        self._grain = np.clip(rng.normal(0, noise, (height, width, 3)), -127, 127).astype(np.int16) if noise else None
        self._scripted = movers
        self._epochs: dict[int, list[Mover]] = {}  # a cache of the last two epochs' movers

    def movers(self, index: int) -> list[Mover]:
        """The movers alive at frame `index`, in drawing order."""
        if self._scripted is not None:
            candidates = self._scripted
        else:
            epoch = index // EPOCH
            candidates = self._epoch(epoch - 1) + self._epoch(epoch) if epoch else self._epoch(0)
        return [m for m in candidates if m.first <= index <= m.last]

    def _epoch(self, epoch: int) -> list[Mover]:
        if epoch not in self._epochs:
            rng = np.random.default_rng([self.seed, 2, epoch])
            self._epochs = {k: v for k, v in self._epochs.items() if k >= epoch - 1}
            self._epochs[epoch] = _crossing_movers(rng, epoch, self.per_epoch, self.width, self.height, self.max_speed)
        return self._epochs[epoch]

    def render(self, index: int) -> tuple[npt.NDArray[np.uint8], GroundTruth]:
        """Frame `index` (>= 0) and its ground truth (boxes clipped to the frame)."""
        image = self._background.copy()
        movers = self.movers(index)
        pad = int(max((m.size for m in movers), default=0)) + 2
        masks = np.zeros((len(movers), self.height + 2 * pad, self.width + 2 * pad), np.uint8)
        boxes = []
        for i, mover in enumerate(movers):
            cx, cy = mover.centre(index)
            boxes.append(draw_shape(image, mover.kind, (cx, cy), mover.size, 0.0, mover.color))
            draw_shape(masks[i], mover.kind, (cx + pad, cy + pad), mover.size, 0.0, (1,))
        if self._grain is not None:
            image = np.asarray(cv2.add(image, self._grain, dtype=cv2.CV_8U), np.uint8)
        visible = np.ones(len(movers), np.float32)
        covered = np.zeros(masks.shape[1:], np.uint8)
        inside = np.zeros(masks.shape[1:], np.uint8)
        inside[pad : pad + self.height, pad : pad + self.width] = 1
        for i in range(len(movers) - 1, -1, -1):  # top-most first
            area = cv2.countNonZero(masks[i])
            shown = cv2.subtract(cv2.bitwise_and(masks[i], inside), covered)
            visible[i] = cv2.countNonZero(shown) / area if area else 0.0
            covered |= masks[i]
        xyxy = np.clip(np.array(boxes, np.float32).reshape(-1, 4), 0, [self.width, self.height] * 2)
        in_frame = (xyxy[:, 2] > xyxy[:, 0]) & (xyxy[:, 3] > xyxy[:, 1])
        truth = Detections.from_arrays(xyxy, np.ones(len(movers), np.float32), [m.kind for m in movers])
        ids = np.array([m.object_id for m in movers], np.int32)
        return image, GroundTruth(truth[in_frame], visible[in_frame], ids[in_frame])
