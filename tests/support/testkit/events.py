"""The object-event tests' camera: 15 FPS, a blank frame, a pipeline section with a door line and
a bay zone; `square` detections and `run`, which hands frames of them to an `EventSink`."""

from __future__ import annotations

import numpy as np

from agent.config.models import CameraSection
from agent.serving.events import EventSink
from pipelines.decoding.detections import Detections
from pipelines.sources.frames import Frame

FPS = 15.0


BLANK = np.zeros((480, 640, 3), np.uint8)


def camera(**extra: object) -> CameraSection:
    return CameraSection.model_validate(
        {
            "name": "cam0",
            "source": "synthetic",
            "lines": [{"name": "door", "points": [[0, 240], [640, 240]]}],
            "zones": [{"name": "bay", "polygon": [[0, 0], [320, 0], [320, 480], [0, 480]]}],
            "tracker": {"lost_frames": 5},
            **extra,
        }
    )


def square(x: float, y: float, score: float = 0.9, class_id: int = 0) -> Detections:
    """One 40-pixel square centred on (`x`, `y`)."""
    return Detections.from_arrays([[x - 20, y - 20, x + 20, y + 20]], [score], [class_id])


def run(sink: EventSink, frames: list[Detections], image: np.ndarray = BLANK) -> None:
    """Each of `frames` to `sink` as camera ``cam0``'s next frame at `FPS`."""
    for index, detections in enumerate(frames):
        sink.handle("cam0", Frame(index, index / FPS, image), detections)
