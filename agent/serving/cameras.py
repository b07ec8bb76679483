"""The daemon's cameras: one `Pipeline` per configured source, all serving the active version.

`activate` loads the installed version once per camera (each pipeline owns its runtime, since
not every runtime may be called from two threads) and either starts the pipelines or swaps the
new model in between frames, so capture never stops for a deployment; the pipeline closes the
runtime it swapped out once no frame uses it. A TensorRT engine that is not built yet is built
in the background (`EngineBuilder`, thread ``engine-build``) while the previous version, or on a
first install ONNX Runtime, serves; the cameras swap to the engine when it is ready and passes
the bundle's parity check, else stay on ONNX Runtime with the reason in `engine_status`. A
camera configured with several workers runs them only on a runtime that allows concurrent
calls; when a deployment moves it between such a runtime and one that does not, its pipeline
restarts instead.

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

from agent.bundles.archive import read_reference
from agent.bundles.install import check_parity
from agent.bundles.manifest import Manifest
from agent.bundles.tuning import Tuning
from agent.config.models import PipelineSection
from agent.errors import BundleError, ErrorCode
from agent.hardware.probe import Board
from agent.serving.engine_builder import EngineBuilder
from agent.serving.loader import Loaded, open_detector
from agent.snapshot import EngineStatus
from pipelines.annotate import BoxAnnotator
from pipelines.detector import Detector
from pipelines.pipeline import Pipeline, PipelineStats, Sink
from pipelines.sources import FrameSource, open_source
from runtimes.registry import RuntimeSettings
from runtimes.selection import Choice, Preference
from runtimes.tensorrt_backend import TensorRTBackend, engine_cache

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


def wanted_workers(section: PipelineSection, tuning: Tuning | None) -> int:
    """The configured workers; for ``auto`` what autotune chose for the version, else 1."""
    if section.workers != "auto":
        return section.workers
    return tuning.workers if tuning is not None else 1


def _workers(section: PipelineSection, detector: Detector, tuning: Tuning | None) -> int:
    """The workers wanted, or 1 on a runtime that serves one call at a time."""
    workers = wanted_workers(section, tuning)
    if workers > 1 and not detector.runtime.concurrent:
        if section.workers == "auto":  # tuned for another runtime (e.g. before a TensorRT engine swapped in)
            return 1
        log.warning(
            "pipeline %s: %s serves one frame at a time; running 1 worker instead of %d",
            section.name,
            detector.runtime.name,
            workers,
        )
        return 1
    return workers


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
        self._wanted: Path | None = None  # the version asked for last (it may wait for its engine)
        self._tuning: Tuning | None = None  # autotune's choice for that version
        self._stopped = False
        self.builder = EngineBuilder(self._engine_done)
        self.fps_cap: float | None = None  # the governor's settings (see `govern`)
        self.paused = False
        self.lighter = False
        self.halted = False

    def activate(self, version: Path, tuning: Tuning | None = None, engine_ready: bool = False) -> None:
        """Serve `version` (an installed bundle folder) on every camera; raises `BundleError`.
        While `halt`ed, only remembers it (and its tuning) for `resume`.

        When TensorRT would serve it but its engine is not built yet, the build starts in the
        background and the version serving now keeps serving (on a first install, ONNX Runtime
        serves the new version); when the engine is ready (`engine_ready`, from the builder) its
        parity is checked and the cameras swap to it, or stay on ONNX Runtime saying why."""
        with self._lock:
            if version != self._wanted or tuning is not None:
                self._tuning = tuning
            self._wanted = version
            if self.halted:
                self.version = version
                return
            self._stopped = False
            loaded = self._load(version)
            if engine_ready and loaded and loaded[0].choice.runtime == "tensorrt":
                loaded = self._checked_engine(version, loaded)
            elif engine_ready and loaded and loaded[0].pending is not None and loaded[0].pending.failure:
                self.builder.fail(ErrorCode.DECODER_MISMATCH, loaded[0].pending.failure)  # the plausibility guard
            if loaded and loaded[0].pending is not None and loaded[0].pending.failure is None:
                self._request_engine(version, loaded[0])
                if self.version is not None and self.version != version and self._pipelines:
                    for model in loaded:
                        model.detector.runtime.close()
                    self.builder.note(f"version {self.version.name[:12]} keeps serving until the engine is ready")
                    return
                self.builder.note(f"{loaded[0].choice.runtime} serves until the engine is ready")
            if loaded:
                self.manifest, self.choice = loaded[0].manifest, loaded[0].choice
            for section, model in zip(self.sections, loaded, strict=True):
                workers = _workers(section, model.detector, self._tuning)
                running = self._pipelines.get(section.name)
                if running is not None and running.workers == workers:
                    running.swap_detector(model.detector)
                    continue
                if running is not None:
                    running.stop()
                    running.detector.runtime.close()
                self._pipelines[section.name] = self._start(section, model.detector, workers)
            self.version = version

    def _load(self, version: Path) -> list[Loaded]:
        return [
            open_detector(
                version,
                self.board,
                self.preference,
                wanted_workers(s, self._tuning),
                self.settings,
                self._tuning,
                self.lighter,
            )
            for s in self.sections
        ]

    def _request_engine(self, version: Path, loaded: Loaded) -> None:
        artifact = loaded.pending_artifact
        assert artifact is not None
        sha256 = next(a.sha256 for a in loaded.manifest.artifacts if a.path == artifact.name)
        self.builder.request(version, loaded.manifest, artifact, sha256, self.settings.tensorrt)

    def _checked_engine(self, version: Path, loaded: list[Loaded]) -> list[Loaded]:
        """The freshly built engine passes the bundle's parity check, or it is recorded as failed
        (so it is not served or rebuilt) and the version is loaded again on the next runtime."""
        runtime = loaded[0].detector.runtime
        try:
            check_parity(
                runtime, runtime.model_path.name, loaded[0].manifest, read_reference(version, loaded[0].manifest)
            )
            return loaded
        except BundleError as exc:
            message = f"the new TensorRT engine fails the bundle's parity check: {exc.message}"
            log.error("%s; ONNX Runtime serves instead", message)
            if isinstance(runtime, TensorRTBackend):
                cache = engine_cache(self.settings.tensorrt)
                cache.record_failure(runtime.record.key, message)
                cache.discard(runtime.record.key)
            self.builder.fail(ErrorCode.PARITY_FAILED, message)
            for model in loaded:
                model.detector.runtime.close()
            return self._load(version)

    def _engine_done(self, version: Path, status: EngineStatus) -> None:
        """From the build thread: swap to the engine (or fall back) if `version` is still wanted."""
        if self._stopped or self._wanted != version:
            return
        try:
            self.activate(version, self._tuning, engine_ready=status.state == "ready")
        except BundleError as exc:
            log.error("after the engine build of %s: %s", status.artifact, exc)

    def engine_status(self) -> EngineStatus | None:
        """The TensorRT engine build in progress, or the last one (None: there was none)."""
        return self.builder.status()

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
            version = self._wanted  # the version asked for last (one waiting for its engine too)
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
        """Start inference again after `halt`, on the version it was given last (with its tuning)."""
        with self._lock:
            self.halted = False
            version = self._wanted
        if version is not None:
            self.activate(version)

    def label(self, class_id: int) -> str:
        """The serving version's name for `class_id` (snapshots show names, not numbers)."""
        labels = self.manifest.labels if self.manifest else []
        return labels[class_id] if 0 <= class_id < len(labels) else str(class_id)

    def stop(self) -> None:
        self._stopped = True
        self.builder.stop()
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
