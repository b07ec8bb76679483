"""Video files for the tests and benchmarks, rendered from the synthetic scene; a JPEG decoder
that counts its decodes (`CountingDecoder`)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import numpy.typing as npt


def write_video(path: Path, frames: int, size: tuple[int, int] = (160, 120), seed: int = 0) -> Path:
    """An MJPG .avi of synthetic frames (every frame a keyframe, so truncation breaks it mid-way)."""
    from pipelines.sources.synthetic import SyntheticScene

    scene = SyntheticScene(width=size[0], height=size[1], num_shapes=3, seed=seed, size_range=(20, 50))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 30.0, size)
    for i in range(frames):
        writer.write(scene.render(i)[0])
    writer.release()
    return path


class CountingDecoder:
    """`cv2.imdecode`, counting its calls by flags (full colour, or each reduced grey)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, data: npt.NDArray[np.uint8], flags: int) -> npt.NDArray[np.uint8] | None:
        self.calls.append(flags)
        decoded = cv2.imdecode(data, flags)
        return None if decoded is None else np.asarray(decoded, np.uint8)

    @property
    def full(self) -> int:
        return self.calls.count(cv2.IMREAD_COLOR)
