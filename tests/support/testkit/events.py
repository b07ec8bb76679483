"""The object-event tests' camera: 15 FPS, a blank frame, a pipeline section with a door line and a bay zone."""

from __future__ import annotations

import numpy as np

from agent.config.models import PipelineSection

FPS = 15.0


BLANK = np.zeros((480, 640, 3), np.uint8)


def camera(**extra: object) -> PipelineSection:
    return PipelineSection.model_validate(
        {
            "name": "cam0",
            "source": "synthetic",
            "lines": [{"name": "door", "points": [[0, 240], [640, 240]]}],
            "zones": [{"name": "bay", "polygon": [[0, 0], [320, 0], [320, 480], [0, 480]]}],
            "tracker": {"lost_frames": 5},
            **extra,
        }
    )
