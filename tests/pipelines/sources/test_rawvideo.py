"""`pipelines.sources.rawvideo`: decoded planes match OpenCV's conversion."""

from __future__ import annotations

import cv2
import numpy as np

from pipelines.sources.rawvideo import RawVideo


def test_decoded_planes_match_opencv() -> None:
    """`to_bgr` against OpenCV's own BGR -> I420 -> BGR round trip on a real image."""
    from pipelines.sources.rawvideo import to_bgr
    from pipelines.sources.synthetic import SyntheticScene

    image, _ = SyntheticScene(width=96, height=64, seed=3, size_range=(10, 30)).render(0)
    planes = cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420)
    assert np.array_equal(to_bgr(planes.tobytes(), RawVideo(96, 64)), cv2.cvtColor(planes, cv2.COLOR_YUV2BGR_I420))
