"""The project's real detectors and what they are judged on (issue 38): the demo detector on the
synthetic scene, the shared COCO YOLOv8n on three photos tiled into one frame; their wrong
versions (`testkit.onnx_models.altered`) and the clips a camera serves them from."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from testkit.onnx_models import altered

#: the shared COCO detector the quality checks are tried on (in `shared_models`)
COCO_MODEL = "yolov8n_int8_640.onnx"
#: the three wrong versions, by the option of `altered` that makes each, given the swapped pair
WRONG = ("swap", "score_scale", "shift")


def wrong_versions(model: Path, folder: Path, swap: tuple[int, int]) -> dict[str, Path]:
    """`model`'s three wrong versions in `folder`, by name: the score channels of `swap`'s two
    classes exchanged, every class score times 0.2, every box moved right by a fifth of the input."""
    options: dict[str, dict[str, Any]] = {
        "swap": {"swap": swap},
        "score_scale": {"score_scale": 0.2},
        "shift": {"shift": 0.2},
    }
    return {name: altered(model, folder / f"{name}.onnx", **options[name]) for name in WRONG}


def photo_frame(photos: dict[str, Path]) -> npt.NDArray[np.uint8]:
    """astronaut, chelsea and coffee side by side over a grey row (1024 x 1536): YOLOv8n sees one
    person, one cat, one cup and one dining table on it, each well under 60% of the frame's width,
    so a shift of a fifth of it takes a box below IoU 0.5 with where it was."""
    tiles = [
        cv2.resize(np.asarray(cv2.imread(str(photos[name]))), (512, 512)) for name in ("astronaut", "chelsea", "coffee")
    ]
    grey = np.full((512, 1536, 3), 114, np.uint8)
    return np.vstack([np.hstack(tiles), grey])


def write_clip(path: Path, images: Iterable[npt.NDArray[np.uint8]], fps: float = 30.0) -> Path:
    """An MJPG .avi of `images` (all of one size): a camera's clip."""
    writer: Any = None
    for image in images:
        if writer is None:
            height, width = image.shape[:2]
            writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (width, height))
        writer.write(image)
    if writer is not None:
        writer.release()
    return path
