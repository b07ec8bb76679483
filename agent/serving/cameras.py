"""The daemon's cameras: one `Pipeline` per configured source, all serving the active version.

`activate` loads the installed version once for all cameras (`cameras.share_model`, the
default: one `SharedModel`, one runtime in memory, frames of several cameras batched when the
model has a dynamic batch axis) or once per camera (``share_model: false``), then either starts
the pipelines or swaps the new model in between frames, so capture never stops for a
deployment. Each pipeline closes the model it swapped out once no frame uses it: its own
runtime, or its hold on the shared model, which closes when its last camera let go. A camera
configured with several workers runs them only on a runtime that allows concurrent calls; when
a deployment moves it between such a runtime and one that does not, its pipeline restarts
instead. Pipe sources (``gst:``, ``ffmpeg:``, ``rpicam:``) get the board's ffmpeg decode
options; what stops one from running here is logged once, at the first start.

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
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.bundles.manifest import Manifest
from agent.config.models import CamerasSection, PipelineSection
from agent.errors import BundleError
from agent.hardware.camera_tools import CameraTools, ffmpeg_input_args, find_camera_tools, source_problems
from agent.hardware.probe import Board
from agent.serving.loader import open_detector
from pipelines.annotate import BoxAnnotator
from pipelines.detector import FrameDetector
from pipelines.pipe_commands import PipeSettings, pipe_tool
from pipelines.pipeline import Pipeline, PipelineStats, Sink
from pipelines.shared_model import BatchPolicy, CameraModel, SharedModel
from pipelines.sources import FrameSource, open_source
from runtimes.registry import RuntimeSettings
from runtimes.selection import Choice, Preference

log = logging.getLogger(__name__)


SYNTHETIC_FPS = 15.0  # the synthetic camera's rate when the config gives none: a live camera, not a clip


def source_for(section: PipelineSection, pipe: PipeSettings | None = None) -> FrameSource:
    """The frame source of a camera; `pipe` holds the settings of pipe sources."""
    camera: dict[str, Any] = {k: getattr(section, k) for k in ("width", "height", "fps") if getattr(section, k)}
    if section.source.startswith("synthetic"):
        camera.setdefault("fps", SYNTHETIC_FPS)
    return open_source(section.source, loop=section.loop, pipe=pipe, **camera)


def pipe_settings(options: CamerasSection, board: Board, tools: CameraTools | None) -> PipeSettings:
    """The settings of pipe sources from the ``cameras:`` section on `board` (`tools` None: not
    asked, so ffmpeg decodes in software): the daemon's and the doctor's."""
    args = ffmpeg_input_args(options.ffmpeg.hwaccel, board, tools)
    return PipeSettings(args, options.ffmpeg.rtsp_transport, options.stall_timeout_s)


def _capped(max_fps: float | None, cap: float | None) -> float | None:
    """The lower of a camera's own ``max_fps`` and the governor's cap (None: no limit)."""
    limits = [limit for limit in (max_fps, cap) if limit is not None]
    return min(limits) if limits else None


def _workers(section: PipelineSection, detector: FrameDetector) -> int:
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
        options: CamerasSection | None = None,
        find_tools: Callable[[], CameraTools] = find_camera_tools,
    ) -> None:
        self.sections, self.board, self.preference = list(sections), board, preference
        self.settings = settings or RuntimeSettings()
        self.options = options or CamerasSection()
        self._find_tools = find_tools
        self._pipe: PipeSettings | None = None  # made at the first start (it may ask the tools)
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
            models = self._load(version)
            for section, model in zip(self.sections, models, strict=True):
                workers = _workers(section, model)
                running = self._pipelines.get(section.name)
                if running is not None and running.workers == workers:
                    running.swap_detector(model)
                    continue
                if running is not None:
                    running.stop()
                    running.detector.close()
                self._pipelines[section.name] = self._start(section, model, workers)
            self.version = version

    def _load(self, version: Path) -> list[FrameDetector]:
        """One detector per camera, in `sections` order: each camera's hold on one shared model,
        or (``share_model: false``) a model of its own. Raises `BundleError` as `open_detector`."""
        if not self.sections:
            return []
        options = self.options
        if not options.share_model:
            loaded = [
                open_detector(version, self.board, self.preference, s.workers, self.settings, self.lighter)
                for s in self.sections
            ]
            self.manifest, self.choice = loaded[0].manifest, loaded[0].choice
            return [model.detector for model in loaded]
        workers = max(s.workers for s in self.sections)
        model = open_detector(version, self.board, self.preference, workers, self.settings, self.lighter)
        if not model.detector.runtime.concurrent:  # one thread (and interpreter) per frame in flight
            workers = min(workers, len(self.sections))
        policy = BatchPolicy(options.batch, options.batch_wait_ms / 1000, options.max_batch)
        try:
            shared = SharedModel(model.detector, workers=workers, policy=policy)
        except Exception:
            model.detector.close()
            raise
        self.manifest, self.choice = model.manifest, model.choice
        return [shared.attach(s.name) for s in self.sections]

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

    def _pipe_settings(self) -> PipeSettings:
        """The pipe sources' settings, made once: the tools are asked only when a camera is a
        pipe source; what stops one from running is logged."""
        if self._pipe is None:
            options = self.options
            tools = self._find_tools() if any(pipe_tool(s.source) for s in self.sections) else None
            for section in self.sections:
                for problem in source_problems(section.source, tools) if tools else []:
                    log.warning("pipeline %s: %s", section.name, problem)
            self._pipe = pipe_settings(options, self.board, tools)
            if any(pipe_tool(s.source) == "ffmpeg" for s in self.sections):
                decode = " ".join(self._pipe.ffmpeg_input_args) or "software (no hardware decoder)"
                log.info("ffmpeg sources decode with %s", decode)
        return self._pipe

    def _start(self, section: PipelineSection, detector: FrameDetector, workers: int) -> Pipeline:
        sinks = [self._sink_for(section.name)] if self._sink_for else []
        annotator = BoxAnnotator(label=self.label)
        pipeline = Pipeline(
            section.name,
            source_for(section, self._pipe_settings()),
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
                pipeline.detector.close()
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
        """Each camera's numbers; `shared_by` and `mean_batch` from its shared model."""
        with self._lock:
            found = []
            for pipeline in self._pipelines.values():
                stats, detector = pipeline.stats(), pipeline.detector
                if isinstance(detector, CameraModel):
                    model = detector.shared.stats()
                    stats = replace(stats, shared_by=model.cameras, mean_batch=model.mean_batch)
                found.append(stats)
            return found
