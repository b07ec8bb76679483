"""`pipelines.tracking.analytics`: its crop helper (the analytics themselves are tested through
`agent.serving.events` and the tracking benchmarks)."""

from __future__ import annotations

import numpy as np

from pipelines.tracking.analytics import crop_box


def test_crop_box_rounds_outward_and_clips_to_the_frame() -> None:
    """The one crop helper (the events' snapshots and the second stage's crops)."""
    image = np.arange(10 * 20 * 3, dtype=np.uint8).reshape(10, 20, 3)
    crop = crop_box(image, [2.7, 1.2, 5.1, 4.0])
    assert crop.shape == (3, 4, 3) and (crop == image[1:4, 2:6]).all(), "x 2..6, y 1..4: outward to whole pixels"
    assert crop_box(image, [-5.0, -3.0, 4.0, 30.0]).shape == (10, 4, 3), "clipped to the frame"
    assert crop_box(image, [25.0, 2.0, 30.0, 5.0]).size == 0, "outside the frame: empty"
    assert crop_box(image, [-9.0, -8.0, -2.0, -1.0]).size == 0, "above and left of the frame: empty, not wrapped"
    before = image.copy()
    crop[:] = 0
    assert (image == before).all(), "a copy, not a view of the frame"
