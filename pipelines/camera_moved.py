"""How far a camera's view moved against a reference image: the shift by phase correlation, the
rotation by phase correlation of the log-polar magnitude spectra (Fourier-Mellin).

Both images are small grey frames of one shape, ``(h, w) float32``, each already normalised
(`normalise`: zero mean, unit spread), so a global change of brightness or gain (lights, dusk)
changes neither number. Pure functions, no state; any thread may call them.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

Grey = npt.NDArray[np.float32]

#: rows of the log-polar spectrum: 360 rows cover 360 degrees (the spectrum repeats every 180)
_ANGLE_ROWS = 360


@dataclass(frozen=True)
class Motion:
    """The view against the reference: `shift_px` (dx, dy) in pixels of the small frame, `rotation_deg`
    in degrees (counter-clockwise positive, within +-90), and `match` (the phase correlation's
    peak, 0..1: near 0 when the two show unrelated pictures)."""

    shift_px: tuple[float, float]
    rotation_deg: float
    match: float

    @property
    def shift(self) -> float:
        """The length of the shift, pixels."""
        return float(np.hypot(*self.shift_px))


def normalise(grey: npt.NDArray[np.float32]) -> Grey:
    """`grey` ``(h, w)`` with zero mean and unit standard deviation (a flat image stays flat, at 0)."""
    mean, std = cv2.meanStdDev(grey)
    out = (grey - np.float32(mean[0, 0])) / np.float32(max(float(std[0, 0]), 1e-3))
    return np.asarray(out, np.float32)


class MotionMeter:
    """Measures `Motion` for frames of one size ``(h, w)`` (its Hanning windows are made once).
    Not thread-safe: one camera's thread uses it."""

    def __init__(self, height: int, width: int) -> None:
        if height < 16 or width < 16:
            raise ValueError(f"frames for motion must be at least 16x16, got {width}x{height}")
        self._window = cv2.createHanningWindow((width, height), cv2.CV_32F)
        side = min(height, width)
        self._side = side
        self._square_window = cv2.createHanningWindow((side, side), cv2.CV_32F)
        # A high-pass over the centred spectrum: the lowest frequencies carry the window, not the scene.
        yy, xx = np.mgrid[-(side // 2) : side - side // 2, -(side // 2) : side - side // 2].astype(np.float32)
        radius = np.hypot(xx, yy) / (side / 2)
        self._high_pass = np.asarray(np.clip(radius, 0, 1) ** 2, np.float32)
        self._polar_window = cv2.createHanningWindow((side, _ANGLE_ROWS), cv2.CV_32F)

    def _log_polar(self, grey: Grey) -> Grey:
        """The log-polar log-magnitude spectrum ``(360, side)`` of `grey`'s centred square."""
        h, w = grey.shape
        top, left = (h - self._side) // 2, (w - self._side) // 2
        square = grey[top : top + self._side, left : left + self._side] * self._square_window
        spectrum = np.fft.fftshift(np.abs(np.fft.fft2(square)))
        magnitude = np.asarray(np.log1p(spectrum) * self._high_pass, np.float32)
        centre = (self._side / 2, self._side / 2)
        polar = cv2.warpPolar(
            magnitude, (self._side, _ANGLE_ROWS), centre, self._side / 2, cv2.WARP_POLAR_LOG + cv2.INTER_LINEAR
        )
        return np.asarray(polar, np.float32)

    def rotation(self, reference: Grey, current: Grey) -> float:
        """Degrees `current` is turned against `reference` (counter-clockwise positive, +-90)."""
        (_, rows), _ = cv2.phaseCorrelate(self._log_polar(reference), self._log_polar(current))
        degrees = -rows * 360.0 / _ANGLE_ROWS
        return float((degrees + 90.0) % 180.0 - 90.0)  # the magnitude spectrum repeats every 180

    def measure(self, reference: Grey, current: Grey) -> Motion:
        """The motion of `current` against `reference`, both ``(h, w)`` normalised (`normalise`)."""
        if reference.shape != current.shape or reference.shape != self._window.shape:
            raise ValueError(f"expected two frames of {self._window.shape}, got {reference.shape} and {current.shape}")
        (dx, dy), match = cv2.phaseCorrelate(reference, current, self._window)
        return Motion((float(dx), float(dy)), self.rotation(reference, current), float(match))
