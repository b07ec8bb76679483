"""A constant-velocity Kalman filter over boxes, batched over tracks (as in SORT / ByteTrack).

State ``(cx, cy, a, h, vcx, vcy, va, vh)``: centre in pixels, aspect ratio ``w / h``, height in
pixels, and their velocities per frame. Noise scales with the box height, so a far (small)
object is trusted to move less than a near one. Pure functions over arrays: ``means (n, 8)``,
``covs (n, 8, 8)``, ``measurements (n, 4)``; no state, any thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]


def to_xyah(xyxy: npt.NDArray[np.floating]) -> Array:
    """``(n, 4)`` xyxy boxes -> ``(n, 4)`` centre x, centre y, aspect w/h, height."""
    boxes = np.asarray(xyxy, np.float64).reshape(-1, 4)
    w, h = boxes[:, 2] - boxes[:, 0], np.maximum(boxes[:, 3] - boxes[:, 1], 1e-6)
    return np.stack([(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2, w / h, h], axis=1)


def to_xyxy(xyah: npt.NDArray[np.floating]) -> Array:
    """The inverse of `to_xyah`."""
    cx, cy, a, h = (np.asarray(xyah, np.float64).reshape(-1, 4)[:, i] for i in range(4))
    w = a * h
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


@dataclass(frozen=True)
class KalmanBoxFilter:
    """`position_noise`, `velocity_noise`: standard deviations as fractions of the box height
    (ByteTrack's 1/20 and 1/160)."""

    position_noise: float = 1 / 20
    velocity_noise: float = 1 / 160

    @property
    def _motion(self) -> Array:
        motion = np.eye(8)
        motion[:4, 4:] = np.eye(4)
        return motion

    def _std(self, h: Array, position: float, velocity: float) -> Array:
        """``(n, 8)`` standard deviations for heights `h (n,)` (aspect terms fixed)."""
        p, v = position * h, velocity * h
        return np.stack([p, p, np.full_like(h, 1e-2), p, v, v, np.full_like(h, 1e-5), v], axis=1)

    def initiate(self, measurement: Array) -> tuple[Array, Array]:
        """A new track's state ``(8,)`` and covariance ``(8, 8)`` from one xyah box ``(4,)``."""
        mean = np.concatenate([measurement, np.zeros(4)])
        std = self._std(measurement[3:4], 2 * self.position_noise, 10 * self.velocity_noise)[0]
        return mean, np.diag(std**2)

    def predict(self, means: Array, covs: Array) -> tuple[Array, Array]:
        """Every state one frame ahead."""
        motion = self._motion
        noise = self._std(means[:, 3], self.position_noise, self.velocity_noise) ** 2
        means = means @ motion.T
        covs = motion @ covs @ motion.T
        covs[:, np.arange(8), np.arange(8)] += noise
        return means, covs

    def update(self, means: Array, covs: Array, measurements: Array) -> tuple[Array, Array]:
        """Correct each state with its measured xyah box."""
        std = self._std(means[:, 3], self.position_noise, 0.0)[:, :4]
        projected_cov = covs[:, :4, :4].copy()
        projected_cov[:, np.arange(4), np.arange(4)] += std**2
        cross = covs[:, :, :4]  # (n, 8, 4): P H^T with H = [I 0]
        gain = np.linalg.solve(projected_cov, cross.transpose(0, 2, 1)).transpose(0, 2, 1)  # (n, 8, 4)
        innovation = measurements - means[:, :4]
        means = means + np.einsum("nij,nj->ni", gain, innovation)
        covs = covs - gain @ projected_cov @ gain.transpose(0, 2, 1)
        return means, covs
