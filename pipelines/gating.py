"""One camera's motion gate as its pipeline runs it (issue 39, docs/cameras.md "Motion"):
`Gating` holds the camera's `pipelines.motion.MotionDetector`, its `pipelines.motion_gate.MotionGate`
and what says whether the camera's tracker holds a confirmed track (`tracks_alive`).

`admit(image, now)` is asked once per frame the pipeline takes (after its FPS cap, so motion is
judged at the rate frames would be inferred): the frame's motion, then the gate's decision.
A frame that came as JPEG (`pipelines.sources.frames.JpegImage`) is judged on a reduced decode
and left undecoded, unless the gate will infer it whatever its motion (`MotionGate.due`: the
frame after motion, a keepalive, the idle interval): then it is decoded first and judged on its
pixels, as its reduced decode would cost more than the grey copy of pixels decoded anyway.
A frame not admitted is not inferred: the pipeline hands it to its sinks with the last inferred
frame's detections (`Frame.inferred` False), since nothing moved. A detector that raises on a
frame is logged once and that frame is admitted (fail open: a broken motion check never hides
an object).

Threads: one camera's inference threads, one at a time (under the pipeline's take lock);
`last` and `ratios` from any thread (plain reads of values replaced whole).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipelines.motion import Motion, MotionDetector
from pipelines.motion_gate import MotionGate
from pipelines.sources.frames import JpegImage

log = logging.getLogger(__name__)


def _no_tracks() -> bool:
    return False


@dataclass(frozen=True)
class GateRatios:
    """What a camera's gate did: the share of frames inferred and the share with motion (0..1),
    and its idle interval (s) and keepalive (FPS) in force (the governor's slowdown applied)."""

    inferred_ratio: float
    motion_ratio: float
    idle_interval_s: float
    keepalive_fps: float


class Gating:
    """`detector` and `gate` of one camera; `tracks_alive` (any thread) whether its tracker
    holds a confirmed track now (None: never, as a camera without analytics)."""

    def __init__(
        self, detector: MotionDetector, gate: MotionGate, tracks_alive: Callable[[], bool] | None = None
    ) -> None:
        self.detector, self.gate = detector, gate
        self.tracks_alive = tracks_alive if tracks_alive is not None else _no_tracks
        self.last: Motion | None = None  # the newest frame's motion (the page draws its regions)
        self._failed = False

    def admit(self, image: npt.NDArray[np.uint8] | JpegImage, now: float) -> bool:
        """Whether the frame `image` (BGR ``(H, W, 3) uint8``, or a frame's `JpegImage`), taken
        at `now` (seconds, the frame's capture time), is inferred."""
        tracks_alive = self.tracks_alive()
        try:
            if isinstance(image, JpegImage) and not image.decoded and self.gate.due(now, tracks_alive):
                image = image.pixels()  # inferred whatever moves: decoded now, judged on its pixels
            motion: Motion | None = self.detector.detect(image)
        except Exception:
            motion = None
            if not self._failed:
                self._failed = True
                log.exception("motion: the detector failed on a frame; such frames are inferred (not logged again)")
        self.last = motion
        return self.gate.decide(now, motion, tracks_alive)

    def ratios(self) -> GateRatios:
        gate = self.gate
        return GateRatios(
            round(gate.inferred_ratio, 4),
            round(gate.motion_ratio, 4),
            round(gate.idle_interval_in_force_s, 3),
            round(gate.keepalive_fps_in_force, 3),
        )
