"""The synthetic scenes as a camera: `SyntheticSource` over a `Scene` (`synthetic.SyntheticScene`,
the shapes with ground truth, or `tracking_scene.TrackingScene`, objects coming and going)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from pipelines.sources.frames import Frame, GroundTruth

if TYPE_CHECKING:
    import numpy.typing as npt


class Scene(Protocol):
    """A scene whose frame ``i`` is a pure function of its seed and ``i``."""

    seed: int
    kind: str  # the source string's prefix: "synthetic" or "tracking"

    def render(self, index: int) -> tuple[npt.NDArray[Any], GroundTruth]: ...


class SyntheticSource:
    """The synthetic scene as a camera. With `fps` it is live and paced to real time; without,
    frames come as fast as they are read. `frames` bounds the clip (``None``: endless)."""

    def __init__(
        self,
        scene: Scene | None = None,
        fps: float | None = None,
        frames: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if scene is None:
            from pipelines.sources.synthetic import SyntheticScene  # numpy and OpenCV load with the scene

            scene = SyntheticScene()
        self.scene: Scene = scene
        self.fps, self.frames = fps, frames
        self.live = fps is not None
        self.name = f"{scene.kind}:seed={scene.seed}"
        self._sleep, self._clock = sleep, clock
        self._index = 0
        self._next_due = 0.0

    def open(self) -> None:
        self._next_due = self._clock()

    def read(self) -> Frame | None:
        if self.frames is not None and self._index >= self.frames:
            return None
        if self.fps:
            delay = self._next_due - self._clock()
            if delay > 0:
                self._sleep(delay)
            self._next_due = max(self._next_due + 1 / self.fps, self._clock() - 1 / self.fps)
        image, truth = self.scene.render(self._index)
        frame = Frame(self._index, self._clock(), image, truth)
        self._index += 1
        return frame

    def close(self) -> None:
        pass
