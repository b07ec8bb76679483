"""Which frames of one camera are inferred: `MotionGate`, pure, its clock the caller's `now`.

`decide(now, motion, tracks_alive)` is asked once per frame offered (``now`` in seconds of a
monotonic clock, never decreasing; ``motion`` the frame's `pipelines.motion.Motion`, or None
where the camera has no detector or it failed on this frame; ``tracks_alive`` when the camera's
tracker holds a confirmed track). ``since`` is ``now`` minus the last inferred frame's ``now``:

=============================  ================================  =========================
case                           condition                         infer
=============================  ================================  =========================
first frame                    nothing inferred yet              yes
motion unknown                 ``motion is None``                yes (fail open)
motion                         ``motion.moving``                 yes
motion just ended              the frame before had motion       yes (where it came to rest)
lighting change                ``motion.recalibrated``           yes (the scene changed)
idle interval due              ``since >= idle_interval_s``      yes
keepalive due                  ``tracks_alive`` and              yes
                               ``since >= 1 / keepalive_fps``
track hold due                 ``tracks_alive`` and              yes
                               ``track_hold_frames`` offered
                               since the last inferred frame
otherwise                      (a still scene, no track due)     no
=============================  ================================  =========================

``track_hold_frames`` (None: no such bound) is the camera's tracker's ``lost_frames``: a track
missing at an inferred frame (the detector missed a stopped object once) ages one frame per
frame not inferred (`ByteTracker.coast`) and ends past ``lost_frames``, so while a track is
alive the gate never leaves more frames uninferred in a row than that, whatever the keepalive,
the idle interval, the camera's FPS or the governor's slowdown: the object is looked at again
while its track is still kept. (A track seen at the last inferred frame does not age while it
coasts, however long.)

So an object that appears without motion (after a reconnect, or standing still when the camera
starts) is found within `idle_interval_s`, and an object that stops keeps its track at
`keepalive_fps` while the tracker predicts between. The first still frame after motion is
inferred too: a frame not inferred is handed on with the last inferred frame's detections, so
that frame must show where what moved came to rest, or that it left (an object leaving the
view leaves no motion behind: the background never held it). The gate caps nothing: a camera's
``max_fps`` and the governor pace frames before they are offered.

It counts frames `offered`, `inferred` and `moving` (with motion): `inferred_ratio` and
`motion_ratio` are those over `offered` (0.0 before any frame).

The governor slows a gate down under heat or a low battery (`slow_down(factor)`, docs/
telemetry.md "The governor"): its idle interval and its keepalive period are both `factor` times
longer (`factor` >= 1; 1 restores agent.yaml's values). Motion, the frame after it and a lighting
change are still inferred at once: a slowdown costs only still frames.

Threads: `decide` is not thread-safe: the camera's thread that runs its detector asks.
`slow_down` may be called from any other thread (the governor's, the daemon's sampler): it
replaces one float, which `decide` reads once per frame, so a frame sees either factor whole.
No global state.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the gate imports no OpenCV: agent.config reads its defaults
    from pipelines.motion import Motion

#: inferred frames per second while a confirmed track is alive and nothing moves (agent.yaml's
#: default): 1/s keeps a still scene with a standing object within 0.25x the ungated CPU at 720p
#: (2/s did not), and keeps the tracking clip's starts, lines and zones (0.5/s did not: a shape
#: motion barely sees was 2 s stale at the clip's end); docs/benchmarks.md, the motion gate
KEEPALIVE_FPS = 1.0
#: the longest a camera goes without an inferred frame, seconds (agent.yaml's default)
IDLE_INTERVAL_S = 2.0


class MotionGate:
    """One camera's gate: `keepalive_fps` (> 0) the rate of inference while a confirmed track is
    alive and nothing moves, `idle_interval_s` (> 0) the longest a camera goes uninferred,
    `track_hold_frames` (>= 1, or None) the most frames offered in a row while a track is alive."""

    def __init__(
        self,
        keepalive_fps: float = KEEPALIVE_FPS,
        idle_interval_s: float = IDLE_INTERVAL_S,
        track_hold_frames: int | None = None,
    ) -> None:
        if track_hold_frames is not None and track_hold_frames < 1:
            raise ValueError(f"track_hold_frames: expected >= 1 frames or None, got {track_hold_frames}")
        if not keepalive_fps > 0:
            raise ValueError(f"keepalive_fps: expected > 0, got {keepalive_fps}")
        if not idle_interval_s > 0:
            raise ValueError(f"idle_interval_s: expected > 0 seconds, got {idle_interval_s}")
        self.keepalive_fps, self.idle_interval_s = keepalive_fps, idle_interval_s
        self.track_hold_frames = track_hold_frames
        self._last: float | None = None
        self._uninferred = 0  # frames offered since the last inferred one (this one counted)
        self._was_moving = False  # the frame before had motion
        self._slowdown = 1.0  # the governor's factor (any thread replaces it, `decide` reads it)
        self.offered = self.inferred = self.moving = 0

    def slow_down(self, factor: float) -> None:
        """Stretch the idle interval and the keepalive period `factor` times (>= 1, finite; 1:
        as configured), from the next frame offered. Any thread."""
        if not (math.isfinite(factor) and factor >= 1.0):
            raise ValueError(f"slow_down: expected a finite factor >= 1, got {factor}")
        self._slowdown = float(factor)

    @property
    def slowdown(self) -> float:
        """The factor in force (1.0: as configured)."""
        return self._slowdown

    @property
    def idle_interval_in_force_s(self) -> float:
        """`idle_interval_s` stretched by the slowdown in force."""
        return self.idle_interval_s * self._slowdown

    @property
    def keepalive_fps_in_force(self) -> float:
        """`keepalive_fps` slowed by the slowdown in force."""
        return self.keepalive_fps / self._slowdown

    def decide(self, now: float, motion: Motion | None, tracks_alive: bool) -> bool:
        """Whether to infer the frame offered at `now` (see the module's table); counts it."""
        self.offered += 1
        moving = motion is not None and motion.moving
        self.moving += moving
        self._uninferred += 1
        wanted = (
            motion is None or motion.moving or motion.recalibrated or self._due(now, tracks_alive, self._uninferred)
        )
        self._was_moving = moving
        if wanted:
            self._last, self._uninferred = now, 0
            self.inferred += 1
            return True
        return False

    def due(self, now: float, tracks_alive: bool) -> bool:
        """Whether the next frame, offered at `now`, will be inferred whatever its motion (the
        first, the one after motion, the idle interval, a keepalive or the track hold due): its
        pixels will be needed anyway. Asked before `decide`; counts nothing."""
        return self._due(now, tracks_alive, self._uninferred + 1)

    def _due(self, now: float, tracks_alive: bool, uninferred: int) -> bool:
        """`due`, with `uninferred` frames offered since the last inferred one (this one too)."""
        if self._last is None or self._was_moving:
            return True
        since, slowdown = now - self._last, self._slowdown  # one read of the governor's factor
        if since >= self.idle_interval_s * slowdown:
            return True
        if not tracks_alive:
            return False
        hold = self.track_hold_frames
        return since >= slowdown / self.keepalive_fps or (hold is not None and uninferred >= hold)

    @property
    def inferred_ratio(self) -> float:
        """Frames inferred over frames offered (0.0 before any)."""
        return self.inferred / self.offered if self.offered else 0.0

    @property
    def motion_ratio(self) -> float:
        """Frames with motion over frames offered (0.0 before any)."""
        return self.moving / self.offered if self.offered else 0.0
