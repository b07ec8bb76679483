"""`pipelines.camera_moved`: the shift and rotation of a rendered scene against its reference, and
neither from a change of brightness."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from testkit.health_clips import HealthScene, scaled, warped

from pipelines.camera_moved import MotionMeter, normalise


def small(frame: np.ndarray) -> np.ndarray:
    grey = cv2.cvtColor(cv2.resize(frame, (160, 90), interpolation=cv2.INTER_AREA), cv2.COLOR_BGR2GRAY)
    return normalise(grey.astype(np.float32))


@pytest.mark.parametrize(
    ("degrees", "shift_fraction", "gain"),
    [
        (0.0, 0.0, 1.0),
        (0.0, 0.10, 1.0),
        (0.0, -0.05, 1.0),
        (5.0, 0.0, 1.0),
        (-4.0, 0.0, 1.0),
        (0.0, 0.0, 0.4),
        (0.0, 0.0, 1.5),
    ],
)
def test_the_shift_and_rotation_against_the_reference_are_measured(
    degrees: float, shift_fraction: float, gain: float
) -> None:
    scene = HealthScene(seed=4)
    meter = MotionMeter(90, 160)
    motion = meter.measure(
        small(scene.render(0)), small(scaled(warped(scene.render(5), degrees, shift_fraction), gain))
    )
    assert motion.shift_px == pytest.approx((shift_fraction * 160, 0.0), abs=2.0)
    assert motion.rotation_deg == pytest.approx(degrees, abs=0.7)
    assert motion.match > 0.3


def test_frames_of_another_size_are_refused() -> None:
    with pytest.raises(ValueError, match="expected two frames of"):
        MotionMeter(90, 160).measure(np.zeros((90, 160), np.float32), np.zeros((80, 160), np.float32))


def test_a_flat_frame_normalises_to_zero() -> None:
    assert not normalise(np.full((20, 20), 7.0, np.float32)).any()
