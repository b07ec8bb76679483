"""The daemon's cameras: one `Pipeline` per configured source, all serving the active version.

`activate` loads the installed version once per camera (each pipeline owns its runtime, since
not every runtime may be called from two threads) and either starts the pipelines or swaps the
new model in between frames, so capture never stops for a deployment; the pipeline closes the
runtime it swapped out once no frame uses it. A camera configured with several workers runs
them only on a runtime that allows concurrent calls; when a deployment moves it between such a
runtime and one that does not, its pipeline restarts instead.

The governor reaches the cameras here: `govern` caps every camera's FPS (below its own
``max_fps``) and pauses or resumes inference, `use_lighter` re-activates the version with its
lightest artifact (or back), `halt` stops inference cleanly and `resume` starts it again. The
governor's settings outlive restarts and deployments: a camera started later gets them too.

Thread safety: every method may be called from any thread (one lock around the pipelines).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.bundles.manifest import Manifest
from agent.config.models import PipelineSection
from agent.errors import BundleError
from agent.hardware.probe import Board
from agent.serving.loader import open_detector
from pipelines.annotate import BoxAnnotator
from pipelines.detector import Detector
from pipelines.pipeline import Pipeline, PipelineStats, Sink
from pipelines.sources import FrameSource, open_source
from runtimes.registry import RuntimeSettings
from runtimes.selection import Choice, Preference

log = logging.getLogger(__name__)


SYNTHETIC_FPS = 15.0  # the synthetic camera's rate when the config gives none: a live camera, not a clip


def source_for(section: PipelineSection) -> FrameSource:
    camera: dict[str, Any] = {k: getattr(section, k) for k in ("width", "height", "fps") if getattr(section, k)}
    if section.source.startswith("synthetic"):
        camera.setdefault("fps", SYNTHETIC_FPS)
    return open_source(section.source, loop=section.loop, **camera)


def _capped(max_fps: float | None, cap: float | None) -> float | None:
    """The lower of a camera's own ``max_fps`` and the governor's cap (None: no limit)."""
    limits = [limit for limit in (max_fps, cap) if limit is not None]
    return min(limits) if limits else None


def _workers(section: PipelineSection, detector: Detector) -> int:
    """The configured workers, or 1 on a runtime that serves one call at a time."""
    if section.workers > 1 and not detector.runtime.concurrent:
        log.warning(
            "pipeline %s: %s serves one frame at a time; running 1 worker instead of %d",
            section.name,
            detector.runtime.name,
            section.workers,
        )
        return 1
    return section.workers


class Cameras:
    """The configured pipelines; `sink_for(name)` makes each pipeline's sink (events)."""

    def __init__(
        self,
        sections: Sequence[PipelineSection],
        board: Board,
        preference: Preference = "auto",
        sink_for: Callable[[str], Sink] | None = None,
        settings: RuntimeSettings | None = None,
    ) -> None:
        self.sections, self.board, self.preference = list(sections), board, preference
        self.settings = settings or RuntimeSettings()
        self._sink_for = sink_for
        self._lock = threading.Lock()
        self._pipelines: dict[str, Pipeline] = {}
        self.version: Path | None = None
        self.manifest: Manifest | None = None
        self.choice: Choice | None = None  # the runtime serving the first camera, and why
        self.fps_cap: float | None = None  # the governor's settings (see `govern`)
        self.paused = False
        self.lighter = False
        self.halted = False

    def activate(self, version: Path) -> None:
        """Serve `version` (an installed bundle folder) on every camera; raises `BundleError`.
        While `halt`ed, only remembers it for `resume`."""
        with self._lock:
            if self.halted:
                self.version = version
                return
            loaded = [
                open_detector(version, self.board, self.preference, s.workers, self.settings, self.lighter)
                for s in self.sections
            ]
            if loaded:
                self.manifest, self.choice = loaded[0].manifest, loaded[0].choice
            for section, model in zip(self.sections, loaded, strict=True):
                workers = _workers(section, model.detector)
                running = self._pipelines.get(section.name)
                if running is not None and running.workers == workers:
                    running.swap_detector(model.detector)
                    continue
                if running is not None:
                    running.stop()
                    running.detector.runtime.close()
                self._pipelines[section.name] = self._start(section, model.detector, workers)
            self.version = version

    def restart(self, name: str | None = None) -> list[str]:
        """Stop and start one pipeline (or all) with a fresh source; returns the names restarted."""
        with self._lock:
            names = [name] if name is not None else list(self._pipelines)
            unknown = [n for n in names if n not in self._pipelines]
            if unknown:
                raise KeyError(f"no running pipeline named {unknown[0]!r}; running: {', '.join(self._pipelines)}")
            for n in names:
                old = self._pipelines[n]
                old.stop()
                section = next(s for s in self.sections if s.name == n)
                self._pipelines[n] = self._start(section, old.detector, old.workers)
            return names

    def _start(self, section: PipelineSection, detector: Detector, workers: int) -> Pipeline:
        sinks = [self._sink_for(section.name)] if self._sink_for else []
        annotator = BoxAnnotator(label=self.label)
        pipeline = Pipeline(
            section.name,
            source_for(section),
            detector,
            max_fps=_capped(section.max_fps, self.fps_cap),
            sinks=sinks,
            annotator=annotator,
            workers=workers,
        )
        if self.paused:
            pipeline.pause()
        return pipeline.start()

    # -- the governor's actions -----------------------------------------------------------------

    def govern(self, fps_cap: float | None, paused: bool) -> None:
        """Cap every camera at `fps_cap` (None: its own ``max_fps`` only) and pause or resume
        inference (capture goes on)."""
        with self._lock:
            self.fps_cap, self.paused = fps_cap, paused
            for section in self.sections:
                pipeline = self._pipelines.get(section.name)
                if pipeline is None:
                    continue
                pipeline.max_fps = _capped(section.max_fps, fps_cap)
                if paused:
                    pipeline.pause()
                else:
                    pipeline.resume()

    def use_lighter(self, lighter: bool) -> bool:
        """Serve the version's lightest artifact (or the policy's choice again); True when the
        cameras were re-activated. Raises `BundleError` as `activate` does."""
        with self._lock:
            if lighter == self.lighter:
                return False
            self.lighter = lighter
            version = self.version
        if version is None or self.halted:
            return False
        try:
            self.activate(version)
        except BundleError:
            with self._lock:
                self.lighter = not lighter  # still serving the other one: try again on the next call
            raise
        return True

    def halt(self) -> None:
        """Stop inference cleanly (pipelines stopped, runtimes closed); `resume` restarts it."""
        self.stop()
        with self._lock:
            self.halted = True

    def resume(self) -> None:
        """Start inference again after `halt`, on the version it last served or was given."""
        with self._lock:
            self.halted = False
            version = self.version
        if version is not None:
            self.activate(version)

    def label(self, class_id: int) -> str:
        """The serving version's name for `class_id` (snapshots show names, not numbers)."""
        labels = self.manifest.labels if self.manifest else []
        return labels[class_id] if 0 <= class_id < len(labels) else str(class_id)

    def stop(self) -> None:
        with self._lock:
            for pipeline in self._pipelines.values():
                pipeline.stop()
            for pipeline in self._pipelines.values():
                pipeline.detector.runtime.close()
            self._pipelines.clear()

    def get(self, name: str | None) -> Pipeline:
        """The named pipeline, or the first one; raises `KeyError` with what is running."""
        with self._lock:
            if not self._pipelines:
                raise KeyError("no pipeline is running (no active bundle, or no pipelines configured)")
            if name is None:
                return next(iter(self._pipelines.values()))
            if name not in self._pipelines:
                raise KeyError(f"no running pipeline named {name!r}; running: {', '.join(self._pipelines)}")
            return self._pipelines[name]

    def stats(self) -> list[PipelineStats]:
        with self._lock:
            return [p.stats() for p in self._pipelines.values()]
