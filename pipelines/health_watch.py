"""One camera's health check as its pipeline runs it (issue 40, docs/cameras.md "Camera health"):
`HealthWatch` samples the frames the camera's source delivers, one every `interval_s` of their
capture time, into the camera's `pipelines.camera_health.CameraHealth`, and keeps the newest
judgement as a `HealthState` (problems with the Unix time each began, and the numbers).

`offer(frame)` is called on the camera's capture thread with every frame read, so only frames of
a source that delivers are judged (a source that is down is a problem of its own) and a paused
or failing inference does not stop the check. A frame not due costs one comparison. When the
problems change, `changed(camera, started, cleared)` is called on that thread (the daemon's
``camera`` events). A check that raises on a frame is logged once and the frame is skipped; a
`changed` that raises is logged once too.

Threads: `offer` on the capture thread only; `state`, `reference` and `reset_reference` from any
thread (`state` and `reference` are values replaced whole by one assignment; a reset is a flag the
capture thread acts on before its next frame, as `CameraHealth` is not thread-safe).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipelines.camera_health import CameraHealth, HealthReport, HealthThresholds, ProblemKind
from pipelines.sources.frames import Frame

log = logging.getLogger(__name__)


#: what a technician does about each kind of problem (the page, doctor and the events say it)
ACTIONS: dict[ProblemKind, str] = {
    "frozen": "the picture does not change: restart the camera (edge-agent's restart, then its power)",
    "dark": "too dark: check the lighting and the camera's IR / night mode, or that nothing covers the lens",
    "overexposed": "too bright: check for the sun or a lamp in view and the camera's exposure settings",
    "low_contrast": "no contrast: clean the lens, check for fog, glare or a wrong exposure",
    "defocused": "blurred: clean the lens (dirt, fog, condensation) and check the focus",
    "covered": "the lens is covered: remove what covers it (a cloth, tape, a bag, a leaf)",
    "moved": "the view moved: check the mount and point the camera back, or accept the new view",
}


@dataclass(frozen=True)
class ProblemSeen:
    """A camera problem held long enough: its `kind`, `since` (Unix seconds when its condition
    began) and `detail` (the numbers, for a person)."""

    kind: ProblemKind
    since: float
    detail: str


@dataclass(frozen=True)
class HealthState:
    """A camera's newest frame judged: its `problems` (in `camera_health.KINDS` order), the mean
    `luminance` and its spread (`contrast`), grey levels; `sharpness` (normalised Laplacian
    variance); `shift_px` (pixels of the grey copy) and `rotation_deg` against the reference (0
    without one); `at`, Unix seconds when it was judged."""

    problems: tuple[ProblemSeen, ...]
    luminance: float
    contrast: float
    sharpness: float
    shift_px: float
    rotation_deg: float
    at: float

    @property
    def kinds(self) -> tuple[ProblemKind, ...]:
        return tuple(problem.kind for problem in self.problems)


#: called with the camera's name, the problems that started and those that cleared
HealthChanged = Callable[[str, tuple[ProblemSeen, ...], tuple[ProblemSeen, ...]], None]


class HealthWatch:
    """`camera`'s health over the frames offered (see the module's docstring); `wall` gives Unix
    seconds (the problems' `since`), the frames' `timestamp` the check's clock."""

    def __init__(
        self,
        camera: str,
        thresholds: HealthThresholds | None = None,
        changed: HealthChanged | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.camera, self.health = camera, CameraHealth(thresholds)
        self._changed, self._wall = changed, wall
        self.state: HealthState | None = None  # None until a frame was judged
        self.reference: npt.NDArray[np.uint8] | None = None  # the grey reference image (read-only)
        self._due: float | None = None  # the capture time of the next frame judged
        self._reset = False
        self._failed = False
        self._report_failed = False

    def reset_reference(self) -> None:
        """The next frame judged becomes the camera's reference image (its new normal view):
        "moved" clears with it (any thread)."""
        self._reset = True

    def offer(self, frame: Frame) -> None:
        """`frame`, just read from the camera's source: judged if one is due (capture thread)."""
        now = frame.timestamp
        if self._due is not None and now < self._due:
            return
        self._due = now + self.health.thresholds.interval_s
        if self._reset:
            self._reset = False
            self.health.reset_reference()
        try:
            report = self.health.observe(frame.image, now)
        except Exception:  # a broken check must never stop the camera
            if not self._failed:
                self._failed = True
                log.exception("camera %s: the health check failed on a frame; skipping such frames", self.camera)
            return
        previous, state = self.state, self._state(report, now)
        self.state, self.reference = state, report.reference
        before = {problem.kind: problem for problem in previous.problems} if previous is not None else {}
        started = tuple(problem for problem in state.problems if problem.kind not in before)
        cleared = tuple(problem for kind, problem in before.items() if kind not in state.kinds)
        if (started or cleared) and self._changed is not None:
            try:
                self._changed(self.camera, started, cleared)
            except Exception:
                if not self._report_failed:  # logged once, as a failing check
                    self._report_failed = True
                    log.exception("camera %s: reporting a change of its health failed", self.camera)

    def _state(self, report: HealthReport, now: float) -> HealthState:
        wall = self._wall()
        previous = {problem.kind: problem for problem in self.state.problems} if self.state is not None else {}
        problems = tuple(
            # a problem keeps the Unix time it was first given (the wall clock may step meanwhile)
            ProblemSeen(p.kind, previous[p.kind].since if p.kind in previous else wall - (now - p.since), p.detail)
            for p in report.problems
        )
        return HealthState(
            problems=problems,
            luminance=round(report.luminance, 1),
            contrast=round(report.contrast, 1),
            sharpness=round(report.sharpness, 3),
            shift_px=round(report.shift_px, 1),
            rotation_deg=round(report.rotation_deg, 2),
            at=wall,
        )
