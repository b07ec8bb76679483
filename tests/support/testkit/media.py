"""Video files for the tests and benchmarks, rendered from the synthetic scene."""

from __future__ import annotations

from pathlib import Path

import cv2


def write_video(path: Path, frames: int, size: tuple[int, int] = (160, 120), seed: int = 0) -> Path:
    """An MJPG .avi of synthetic frames (every frame a keyframe, so truncation breaks it mid-way)."""
    from pipelines.sources.synthetic import SyntheticScene

    scene = SyntheticScene(width=size[0], height=size[1], num_shapes=3, seed=seed, size_range=(20, 50))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 30.0, size)
    for i in range(frames):
        writer.write(scene.render(i)[0])
    writer.release()
    return path
