"""Each camera's drift score, its baseline kept in the state directory (docs/cameras.md#drift).

`DriftWatch.after(camera, sink)` feeds a camera's pipeline's frames to `sink`, then: for each inferred frame
(`Frame.inferred`; a frame the motion gate let pass carries the last inferred frame's
detections and is skipped) it hands the detections' labels, scores and area shares to the
camera's `pipelines.drift.DriftTracker` for the version serving now (`version()`, the bundle's
digest). The first frame of a version loads that version's baseline from
``<state_dir>/drift/<camera>@<version>.json``, or starts a new one: another version starts
another baseline, and the camera's files beyond its `KEEP_PER_CAMERA` newest are removed (a
rollback finds its version's baseline again). A baseline being captured is written (atomically,
`runtimes.files.atomic_write`) at most every `SAVE_EVERY_S` seconds and when it completes, so a
restart loses at most that much of it; a complete one is never written again. A file that cannot
be read (too big, not JSON, not a baseline) is logged and replaced by a new baseline.

Threads: each camera's sink runs on its inference thread; `reports` from any thread.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from agent.config.models import CameraSection
from agent.throttle import ThrottledLog
from pipelines.decoding.detections import Detections
from pipelines.drift import MAX_DOCUMENT_BYTES, Baseline, CameraDrift, DriftScore, DriftTracker
from pipelines.pipeline import Sink
from pipelines.sources.frames import Frame
from runtimes.files import atomic_write, read_at_most

log = logging.getLogger(__name__)

#: the folder of the baselines under the state directory
DIRECTORY = "drift"
#: the baselines kept per camera (the newest by modification time)
KEEP_PER_CAMERA = 3
#: the most clock seconds between two writes of a baseline being captured
SAVE_EVERY_S = 300.0


class _Camera:
    def __init__(self, section: CameraSection) -> None:
        self.name = section.name
        self.settings = section.drift
        self.tracker: DriftTracker | None = None
        self.saved_at = -float("inf")
        #: `drifted`'s answer and what it was scored on: the tracker, its buckets begun, its
        #: baseline complete (one tuple, replaced whole)
        self.flag: tuple[DriftTracker, int, bool, bool] | None = None


class DriftWatch:
    """The drift of every camera with ``drift.enabled``; `version()` names the version serving
    (None: none), `labels()` its class names by id, `clock` counts seconds (monotonic)."""

    def __init__(
        self,
        sections: Sequence[CameraSection],
        state_dir: Path,
        version: Callable[[], str | None],
        labels: Callable[[], Sequence[str]],
        clock: Callable[[], float] = time.monotonic,
        score: Callable[[DriftTracker], DriftScore | None] = DriftTracker.report,
    ) -> None:
        self.folder = state_dir / DIRECTORY
        self._version, self._labels, self._clock, self._score = version, labels, clock, score
        self._cameras = {s.name: _Camera(s) for s in sections if s.drift.enabled}
        self._throttled = ThrottledLog(log, every_s=600.0, clock=clock)

    def after(self, camera: str, sink: Sink) -> Sink:
        """What `camera`'s pipeline hands each frame to: `sink` (the events), then the drift
        (`sink` alone where drift is off for the camera)."""
        if camera not in self._cameras:
            return sink

        def feed(frame: Frame, detections: Detections) -> None:
            sink(frame, detections)
            self.observe(camera, frame, detections)

        return feed

    def observe(self, camera: str, frame: Frame, detections: Detections) -> None:
        """One frame of `camera` delivered with its detections (its inference thread)."""
        state = self._cameras.get(camera)
        version = self._version()
        if state is None or version is None or not frame.inferred:
            return
        tracker = state.tracker
        if tracker is None or tracker.baseline.version != version:
            if tracker is not None and not tracker.baseline.complete:
                self._save(state, tracker.baseline)  # its progress, for a rollback to it
            tracker = state.tracker = self._open(state, version)
        names = self._labels()
        labels = [names[c] if 0 <= c < len(names) else str(c) for c in detections.class_id.tolist()]
        height, width = frame.size
        xyxy = detections.xyxy.astype(np.float64)
        shares = (xyxy[:, 2] - xyxy[:, 0]).clip(0) * (xyxy[:, 3] - xyxy[:, 1]).clip(0) / max(1, width * height)
        if tracker.add(labels, detections.confidence, shares) and (
            tracker.baseline.complete or self._clock() - state.saved_at >= SAVE_EVERY_S
        ):
            self._save(state, tracker.baseline)

    def _path(self, camera: str, version: str) -> Path:
        return self.folder / f"{camera}@{version}.json"

    def _open(self, state: _Camera, version: str) -> DriftTracker:
        path = self._path(state.name, version)
        baseline = Baseline(version)
        try:
            # FileTooLarge is a ValueError: a file too large is unreadable, as broken JSON is
            baseline = Baseline.from_json(json.loads(read_at_most(path, MAX_DOCUMENT_BYTES)))
            if baseline.version != version:
                raise ValueError(f"it is the baseline of version {baseline.version[:12]}")
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:  # json's errors are ValueErrors
            self._throttled.warning(str(path), "drift: %s unreadable (%s); a new baseline starts", path, exc)
            baseline = Baseline(version)
        state.saved_at = self._clock()
        s = state.settings
        return DriftTracker(baseline, s.baseline_h * 3600.0, s.window_h * 3600.0, self._clock)

    def _save(self, state: _Camera, baseline: Baseline) -> None:
        path = self._path(state.name, baseline.version)
        fresh = not path.exists()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write(path, json.dumps(baseline.to_json(), separators=(",", ":")).encode())
        except OSError as exc:
            self._throttled.warning(str(path), "drift: cannot keep %s: %s", path, exc)
            return
        state.saved_at = self._clock()
        if fresh:
            self._prune(state.name)

    def _prune(self, camera: str) -> None:
        """Keep the camera's `KEEP_PER_CAMERA` newest baselines."""
        try:
            files = sorted(self.folder.glob(f"{camera}@*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in files[KEEP_PER_CAMERA:]:
                old.unlink(missing_ok=True)
        except OSError as exc:
            self._throttled.warning(f"prune {camera}", "drift: cannot prune %s's baselines: %s", camera, exc)

    def reports(self) -> tuple[CameraDrift, ...]:
        """Every watched camera's drift now (any thread)."""
        return tuple(self._report(state) for state in self._cameras.values())

    def drifted(self, camera: str) -> bool:
        """Whether `camera`'s score has reached its threshold (any thread). A score costs about
        0.3 ms and the samples ask on the camera's thread for every frame that may be kept, so
        the answer is scored again only when the window has begun a new bucket (every
        ``window_h`` / `pipelines.drift.WINDOW_BUCKETS`) or the baseline completed, and read
        from the cache in between. False for a camera not watched, or before its first frame."""
        state = self._cameras.get(camera)
        tracker = state.tracker if state is not None else None
        if state is None or tracker is None:
            return False
        flag, begun, complete = state.flag, tracker.buckets_begun, tracker.baseline.complete
        if flag is not None and flag[0] is tracker and flag[1:3] == (begun, complete):
            return flag[3]
        drifted = self._report(state).drifted
        state.flag = (tracker, begun, complete, drifted)
        return drifted

    def _report(self, state: _Camera) -> CameraDrift:
        tracker = state.tracker
        baseline = tracker.baseline if tracker is not None else None
        return CameraDrift(
            camera=state.name,
            version=baseline.version if baseline is not None else None,
            baseline_s=round(baseline.summary.seconds, 1) if baseline is not None else 0.0,
            complete=baseline is not None and baseline.complete,
            score=self._score(tracker) if tracker is not None else None,
            threshold=state.settings.threshold,
        )
