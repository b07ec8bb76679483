"""The daemon's cameras: one `Pipeline` per configured source, all serving the active version.

`activate` loads the installed version once for all cameras (`cameras.share_model`, the
default: one `SharedModel`, one runtime in memory, frames of several cameras batched when the
model has a dynamic batch axis) or once per camera (``share_model: false``), then either starts
the pipelines or swaps the new model in between frames, so capture never stops for a
deployment. Each pipeline closes the model it swapped out once no frame uses it: its own
runtime, or its hold on the shared model, which closes when its last camera let go.

A TensorRT engine that is not built yet is built in the background (`EngineBuilder`, thread
``engine-build``) while the previous version, or on a first install ONNX Runtime, serves; when
it is ready and passes the bundle's parity check, the version is loaded again on the engine
(one shared model, as above) and every camera swaps to it between frames; else the cameras stay
on ONNX Runtime with the reason in `engine_status`. A camera configured with several workers
runs them only on a runtime that allows concurrent calls; when a deployment moves it between
such a runtime and one that does not, its pipeline restarts instead. Pipe sources (``gst:``,
``ffmpeg:``, ``rpicam:``) get the board's ffmpeg decode options; what stops one from running
here is logged once, at the first start.

Each camera keeps detections by its own thresholds (`agent.serving.camera_filter`: agent.yaml's
``cameras[].conf``, ``iou``, ``max_det``, ``classes`` over the manifest's), applied to its
outputs after the shared inference; they are resolved again for every version activated (a
deployment, a rollback, the lighter artifact, a TensorRT engine), and `thresholds` says what
each camera keeps now.

The governor reaches the cameras here: `govern` caps every camera's FPS (below its own
``max_fps``; a camera with a motion gate by the gated cap, and its gate slowed down: a longer
idle interval and keepalive period) and pauses or resumes inference, `use_lighter`
re-activates the version with its lightest artifact (or back; the second stage's classifier
too), `halt` stops inference cleanly and `resume` starts it again. The governor's settings
outlive restarts and deployments: a camera started later gets them too. Each version
activated hands the second stage (`agent.serving.classifying`) its classifier, or None.

Thread safety: every method may be called from any thread (one lock around the pipelines).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from agent.bundles.archive import read_reference
from agent.bundles.installer import check_parity
from agent.bundles.manifest import Manifest
from agent.bundles.record import Tuning
from agent.config.models import CameraSection, ServingSection
from agent.errors import BundleError, ErrorCode
from agent.event_values import CameraEndReason
from agent.hardware.board import Board
from agent.hardware.camera_tools import CameraTools, ffmpeg_input_args, find_camera_tools, source_problems
from agent.serving.camera_filter import Locate, camera_filter, dotted, in_force
from agent.serving.classifying import ClassifyingStage
from agent.serving.engine_builder import EngineBuilder
from agent.serving.loader import Loaded, open_classifier, open_detector
from agent.serving.shadow import Disagreed, ShadowCamera, ShadowSession, one_thread
from agent.snapshot import EngineStatus, MotionView, ThresholdsInForce
from pipelines.annotate import BoxAnnotator
from pipelines.decoding.decoders import DecoderError
from pipelines.decoding.detector import CameraDetector, FrameDetector
from pipelines.gating import Gating
from pipelines.health_watch import HealthChanged, HealthWatch
from pipelines.measure.second_stage import SecondStages
from pipelines.motion import MotionDetector
from pipelines.motion_gate import MotionGate
from pipelines.pipeline import Pipeline, PipelineStats, Sink
from pipelines.regions import RegionSchedule
from pipelines.shared_model import BatchPolicy, CameraModel, SharedModel
from pipelines.sources.frames import FrameSource
from pipelines.sources.pipe_commands import PipeSettings, pipe_tool
from pipelines.sources.specs import open_source
from runtimes.base import Runtime
from runtimes.registry import RuntimeSettings
from runtimes.selection import Choice, Preference
from runtimes.tensorrt_backend import TensorRTBackend

log = logging.getLogger(__name__)


SYNTHETIC_FPS = 15.0  # the synthetic camera's rate when the config gives none: a live camera, not a clip


def source_for(section: CameraSection, pipe: PipeSettings | None = None) -> FrameSource:
    """The frame source of a camera; `pipe` holds the settings of pipe sources."""
    camera: dict[str, Any] = {k: getattr(section, k) for k in ("width", "height", "fps") if getattr(section, k)}
    if section.source.startswith("synthetic"):
        camera.setdefault("fps", SYNTHETIC_FPS)
    return open_source(section.source, loop=section.loop, pipe=pipe, **camera)


def pipe_settings(options: ServingSection, board: Board, tools: CameraTools | None) -> PipeSettings:
    """The settings of pipe sources from the ``cameras:`` section on `board` (`tools` None: not
    asked, so ffmpeg decodes in software): the daemon's and the doctor's."""
    args = ffmpeg_input_args(options.ffmpeg.hwaccel, board, tools)
    return PipeSettings(args, options.ffmpeg.rtsp_transport, options.stall_timeout_s)


def _capped(max_fps: float | None, cap: float | None) -> float | None:
    """The lower of a camera's own ``max_fps`` and the governor's cap (None: no limit)."""
    limits = [limit for limit in (max_fps, cap) if limit is not None]
    return min(limits) if limits else None


def wanted_workers(section: CameraSection, tuning: Tuning | None) -> int:
    """The configured workers; for ``auto`` what autotune chose for the version, else 1."""
    if section.workers != "auto":
        return section.workers
    return tuning.workers if tuning is not None else 1


def _workers(section: CameraSection, detector: FrameDetector, tuning: Tuning | None) -> int:
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


def _serving_threads(runtime: Runtime, workers: int, cameras: int) -> int:
    """The shared model's serving threads: `workers` on a runtime that allows concurrent calls;
    else one per camera at most, each with the backend's per-thread state (a LiteRT
    interpreter, a TensorRT execution context), and 1 where a backend has none to give
    (`Runtime.for_worker` not overridden)."""
    if runtime.concurrent:
        return workers
    if type(runtime).for_worker is Runtime.for_worker:
        return 1
    return min(workers, cameras)


class Cameras:
    """The configured pipelines; `sink_for(name)` makes each pipeline's sink (events); `locate`
    turns a key path of agent.yaml into ``FILE:LINE: key`` for the problems it reports."""

    def __init__(
        self,
        sections: Sequence[CameraSection],
        board: Board,
        preference: Preference = "auto",
        sink_for: Callable[[str], Sink] | None = None,
        settings: RuntimeSettings | None = None,
        options: ServingSection | None = None,
        find_tools: Callable[[], CameraTools] = find_camera_tools,
        locate: Locate = dotted,
        stage: ClassifyingStage | None = None,
        tracks_alive_for: Callable[[str], Callable[[], bool]] | None = None,
        health_changed: HealthChanged | None = None,
    ) -> None:
        """`stage` is the second stage: each version activated hands it the version's
        classifier (its lightest artifact under the governor's `use_lighter`), or None.
        `tracks_alive_for(name)` says whether that camera's tracker holds a confirmed track (the
        motion gate's keepalive, for a camera whose ``motion.enabled``). `health_changed` is
        told (on the camera's capture thread) when a camera's health problems start or clear."""
        self.sections, self.board, self.preference = list(sections), board, preference
        self.stage = stage
        self._locate = locate
        self._filter_problems: dict[str, tuple[str, ...]] = {}  # per camera, for the version serving
        self._logged: set[str] = set()  # problems logged already (an activation repeats them)
        self.settings = settings or RuntimeSettings()
        self.options = options or ServingSection()
        self._find_tools = find_tools
        self._pipe: PipeSettings | None = None  # made at the first start (it may ask the tools)
        self._sink_for = sink_for
        self._tracks_alive_for = tracks_alive_for
        self._health_changed = health_changed
        self._watches: dict[str, HealthWatch] = {}  # per camera with health.enabled, kept across restarts
        self._lock = threading.Lock()
        self._pipelines: dict[str, Pipeline] = {}
        self._shadows: list[ShadowSession] = []  # open shadows, told of a camera's new pipeline
        #: told of each frame a shadow's two versions disagreed on (the daemon's samples; None: none)
        self.shadow_disagreed: Disagreed | None = None
        self.version: Path | None = None
        self.manifest: Manifest | None = None
        self.choice: Choice | None = None  # the runtime serving the first camera, and why
        self._wanted: Path | None = None  # the version asked for last (it may wait for its engine)
        self._tuning: Tuning | None = None  # autotune's choice for that version
        self._stopped = False
        self.builder = EngineBuilder(self._engine_done)
        self.fps_cap: float | None = None  # the governor's settings (see `govern`)
        self.gated_fps_cap: float | None = None
        self.gate_slowdown = 1.0
        self.paused = False
        self.lighter = False
        self.halted = False

    def activate(self, version: Path, tuning: Tuning | None = None, engine_ready: bool = False) -> None:
        """Serve `version` (an installed bundle folder) on every camera; raises `BundleError`.
        While `halt`ed, only remembers it (and its tuning) for `resume`.

        When TensorRT would serve it but its engine is not built yet, the build starts in the
        background and the version serving now keeps serving (on a first install, ONNX Runtime
        serves the new version); when the engine is ready (`engine_ready`, from the builder) its
        parity is checked and the cameras swap to it (to one shared engine), or stay on ONNX
        Runtime saying why."""
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
                    for unused in loaded:
                        unused.detector.close()
                    self.builder.note(f"version {self.version.name[:12]} keeps serving until the engine is ready")
                    return
                self.builder.note(f"{loaded[0].choice.runtime} serves until the engine is ready")
            models = self._camera_models(loaded)
            for section, model in zip(self.sections, models, strict=True):
                workers = _workers(section, model, self._tuning)
                running = self._pipelines.get(section.name)
                if running is not None and running.workers == workers:
                    running.swap_detector(model)
                    continue
                if running is not None:
                    running.stop()
                    running.detector.close()
                self._pipelines[section.name] = self._start(section, model, workers)
            self.version = version
            self._serve_stage(version)

    def _serve_stage(self, version: Path) -> None:
        """Hand the second stage `version`'s classifier (lighter under the governor), or None
        without one; a classifier that will not load here is logged and the stage left off (the
        detector serves on: activation checked the classifier, so this is rare)."""
        if self.stage is None:
            return
        if not self.sections:  # no camera: nothing to classify
            self.stage.serve(None)
            return
        try:
            loaded = open_classifier(version, self.board, self.preference, self.settings, self.lighter)
        except BundleError as exc:
            log.error("the second stage is off: %s", exc)
            loaded = None
        self.stage.serve(loaded)

    def _load(self, version: Path) -> list[Loaded]:
        """`version` loaded once for all cameras (``share_model``, the default), or once per
        camera in `sections` order (``share_model: false``); none without cameras. Raises
        `BundleError` as `open_detector`."""
        if not self.sections:
            return []
        workers = [wanted_workers(s, self._tuning) for s in self.sections]
        if self.options.share_model:
            workers = [max(workers)]
        return [
            open_detector(version, self.board, self.preference, w, self.settings, self._tuning, self.lighter)
            for w in workers
        ]

    def _camera_models(self, loaded: list[Loaded]) -> list[FrameDetector]:
        """One detector per camera, in `sections` order: each camera's hold on the one shared
        model, or (``share_model: false``) the model loaded for it."""
        if not loaded:
            return []
        self.manifest, self.choice = loaded[0].manifest, loaded[0].choice
        filters = [camera_filter(i, s, self.manifest, self._locate) for i, s in enumerate(self.sections)]
        self._filter_problems = {s.name: f.problems for s, f in zip(self.sections, filters, strict=True)}
        for problem in (p for f in filters for p in f.problems if p not in self._logged):
            log.warning("%s", problem)
            self._logged.add(problem)
        if not self.options.share_model:
            return [
                CameraDetector(model.detector, f.detection_filter) for model, f in zip(loaded, filters, strict=True)
            ]
        options, detector = self.options, loaded[0].detector
        wanted = max(wanted_workers(s, self._tuning) for s in self.sections)
        workers = _serving_threads(detector.runtime, wanted, len(self.sections))
        max_batch = options.max_batch
        if isinstance(detector.runtime, TensorRTBackend) and detector.runtime.max_batch is not None:
            max_batch = min(max_batch, detector.runtime.max_batch)  # an engine takes what its profile allows
        policy = BatchPolicy(options.batch, options.batch_wait_ms / 1000, max_batch)
        try:
            shared = SharedModel(detector, workers=workers, policy=policy)
        except Exception:
            detector.close()
            raise
        return [shared.attach(s.name, f.detection_filter) for s, f in zip(self.sections, filters, strict=True)]

    def _request_engine(self, version: Path, loaded: Loaded) -> None:
        artifact = loaded.pending_artifact
        assert artifact is not None
        sha256 = next(a.sha256 for a in loaded.manifest.artifacts if a.path == artifact.name)
        self.builder.request(version, loaded.manifest, artifact, sha256, self.settings)

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
                runtime.reject(message)
            self.builder.fail(ErrorCode.PARITY_FAILED, message)
            for model in loaded:
                model.detector.close()
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
                raise KeyError(f"no running camera named {unknown[0]!r}; running: {', '.join(self._pipelines)}")
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

    def _gating(self, section: CameraSection) -> Gating | None:
        """`section`'s motion gate (None unless its ``motion.enabled``): a new background per
        start of its pipeline."""
        motion = section.motion
        if motion is None or not motion.enabled:
            return None
        alive = self._tracks_alive_for(section.name) if self._tracks_alive_for is not None else None
        # never more frames uninferred in a row while a track is alive than its tracker keeps a
        # missing track for (0: a missing track ends at once, nothing to hold)
        gate = MotionGate(motion.keepalive_fps, motion.idle_interval_s, section.tracker.lost_frames or None)
        gate.slow_down(self.gate_slowdown)
        return Gating(MotionDetector(motion.settings()), gate, alive)

    def _watch(self, section: CameraSection) -> HealthWatch | None:
        """`section`'s health check (None unless its ``health.enabled``): one per camera, kept
        across its pipeline's restarts (its baselines and reference image go on)."""
        if not section.health.enabled:
            return None
        if section.name not in self._watches:
            thresholds = section.health.thresholds()
            self._watches[section.name] = HealthWatch(section.name, thresholds, self._health_changed)
        return self._watches[section.name]

    def keep_health_of(self, previous: Cameras) -> list[tuple[HealthWatch, CameraEndReason]]:
        """Take over `previous`'s health checks (the cameras a reload replaces, stopped) for each
        camera whose source and ``health:`` section did not change: its baselines, reference image
        and problems go on, so a problem still present is not announced again as it would be by
        a new check. Returns the checks left behind, each with why (its camera removed, or its
        source or ``health:`` changed): their open problems end here, unseen by any check.
        Called before `activate`."""
        now = {section.name: section for section in self.sections}
        with previous._lock:
            watches = dict(previous._watches)
        left: list[tuple[HealthWatch, CameraEndReason]] = []
        with self._lock:
            for was in previous.sections:
                watch, section = watches.get(was.name), now.get(was.name)
                if watch is None:
                    continue
                if section is None:
                    left.append((watch, "camera removed"))
                elif (was.source, was.health) == (section.source, section.health):
                    self._watches[section.name] = watch
                else:
                    left.append((watch, "camera reconfigured"))
        return left

    def health_watch(self, name: str) -> HealthWatch:
        """The named camera's health check (its `reference` image, `reset_reference`); raises
        `KeyError` for a camera without one (any thread)."""
        with self._lock:
            if name not in self._watches:
                raise KeyError(f"no camera named {name!r} with a health check; checked: {', '.join(self._watches)}")
            return self._watches[name]

    @staticmethod
    def _regions(section: CameraSection) -> RegionSchedule | None:
        """`section`'s region schedule (None unless its ``motion.regions``)."""
        motion = section.motion
        if motion is None or not motion.enabled or not motion.regions:
            return None
        return RegionSchedule(motion.full_frame_interval_s)

    def _start(self, section: CameraSection, detector: FrameDetector, workers: int) -> Pipeline:
        sinks = [self._sink_for(section.name)] if self._sink_for else []
        annotator = BoxAnnotator(label=self.label)
        pipeline = Pipeline(
            section.name,
            source_for(section, self._pipe_settings()),
            detector,
            max_fps=_capped(section.max_fps, self._cap_for(section)),
            sinks=sinks,
            annotator=annotator,
            workers=workers,
            gating=self._gating(section),
            health=self._watch(section),
            regions=self._regions(section),
        )
        if self.paused:
            pipeline.pause()
        pipeline.start()
        for session in self._shadows:
            session.move(section.name, pipeline)
        return pipeline

    # -- the governor's actions -----------------------------------------------------------------

    def _cap_for(self, section: CameraSection) -> float | None:
        """The governor's FPS cap for `section`: the gated cap where its motion gate is on."""
        gated = section.motion is not None and section.motion.enabled
        return self.gated_fps_cap if gated else self.fps_cap

    def govern(
        self, fps_cap: float | None, paused: bool, gated_fps_cap: float | None = None, gate_slowdown: float = 1.0
    ) -> None:
        """Cap every camera without a motion gate at `fps_cap` and every camera with one at
        `gated_fps_cap` (None: its own ``max_fps`` only), stretch the gates' idle interval and
        keepalive period `gate_slowdown` times (>= 1), and pause or resume inference (capture
        goes on)."""
        with self._lock:
            self.fps_cap, self.paused = fps_cap, paused
            self.gated_fps_cap, self.gate_slowdown = gated_fps_cap, gate_slowdown
            for section in self.sections:
                pipeline = self._pipelines.get(section.name)
                if pipeline is None:
                    continue
                pipeline.max_fps = _capped(section.max_fps, self._cap_for(section))
                if pipeline.gating is not None:
                    pipeline.gating.gate.slow_down(gate_slowdown)
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

    def shadow(
        self, version: Path, share: float, loaded_is: Literal["candidate", "reference"] = "candidate"
    ) -> ShadowSession:
        """Run `version` (an installed bundle folder) beside the serving version on every running
        camera at `share` of the time (`agent.serving.shadow`), each camera's own thresholds
        resolved against its manifest; `version` is the candidate, or (``reference``, probation's
        agreement check) the previous version the serving one is judged against. Raises
        `BundleError` ``SHADOW_UNAVAILABLE`` when no camera serves (none configured, none active
        yet, or halted by the governor) or `version` does not load here."""
        with self._lock:
            running = [
                (i, s, self._pipelines[s.name]) for i, s in enumerate(self.sections) if s.name in self._pipelines
            ]
        if not running:
            raise BundleError(
                ErrorCode.SHADOW_UNAVAILABLE,
                "no camera is serving here (none configured, no version active, or halted by the governor): "
                "a shadow has nothing to compare the candidate with",
            )
        settings = one_thread(self.settings)
        try:
            loaded = open_detector(version, self.board, self.preference, 1, settings, None, self.lighter)
        except (BundleError, DecoderError) as exc:
            message = exc.message if isinstance(exc, BundleError) else str(exc)
            raise BundleError(
                ErrorCode.SHADOW_UNAVAILABLE, f"the {loaded_is} cannot be loaded beside the serving version: {message}"
            ) from exc
        cameras = {
            section.name: ShadowCamera(
                pipeline,
                CameraDetector(
                    loaded.detector, camera_filter(i, section, loaded.manifest, self._locate).detection_filter
                ),
            )
            for i, section, pipeline in running
        }
        manifest = loaded.manifest
        log.info(
            "shadow: %s %s (the %s) beside the serving version on %d camera(s)",
            manifest.name,
            manifest.version,
            loaded_is,
            len(cameras),
        )
        stages = self._second_stages(version, manifest, loaded_is, settings)
        session = ShadowSession(
            loaded.detector, cameras, share, loaded_is=loaded_is, stages=stages, disagreed=self.shadow_disagreed
        ).start()
        with self._lock:  # a camera restarted while it runs hands the session its new pipeline
            self._shadows = [s for s in self._shadows if not s.closed] + [session]
        return session

    def _second_stages(
        self, version: Path, manifest: Manifest, loaded_is: Literal["candidate", "reference"], settings: RuntimeSettings
    ) -> SecondStages | None:
        """Both versions' classifiers for the shadow's top-1 comparison, each loaded for the
        shadow's thread (`version`'s, whose `manifest` is given, and the serving version's again:
        the second stage's own is its thread's). None unless both versions have one; one that
        does not load is logged and the comparison left out."""
        serving_version, serving_manifest = self.version, self.manifest
        if manifest.classifier is None or serving_version is None or serving_manifest is None:
            return None
        if serving_manifest.classifier is None:
            return None
        opened = []
        try:
            for folder in (version, serving_version):
                stage = open_classifier(folder, self.board, self.preference, settings, self.lighter)
                if stage is not None:
                    opened.append(stage)
        except BundleError as exc:
            for stage in opened:
                stage.close()
            log.warning("shadow: the second stages are not compared: %s", exc)
            return None
        if len(opened) != 2:  # not reached: both manifests name a classifier
            for stage in opened:
                stage.close()
            return None
        loaded, serving = ((s.classifier, s.stage.labels, s.stage.for_labels) for s in opened)
        if loaded_is == "candidate":
            return SecondStages.of(serving, loaded, serving_manifest.labels)
        return SecondStages.of(loaded, serving, manifest.labels)

    def labels(self) -> list[str]:
        """The serving version's class names, by class id (none while nothing is served)."""
        return self.manifest.labels if self.manifest else []

    def label(self, class_id: int) -> str:
        """The serving version's name for `class_id` (snapshots show names, not numbers)."""
        labels = self.labels()
        return labels[class_id] if 0 <= class_id < len(labels) else str(class_id)

    def stop(self) -> None:
        self._stopped = True
        self.builder.stop()
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
                raise KeyError("no camera is running (no active bundle, or no cameras configured)")
            if name is None:
                return next(iter(self._pipelines.values()))
            if name not in self._pipelines:
                raise KeyError(f"no running camera named {name!r}; running: {', '.join(self._pipelines)}")
            return self._pipelines[name]

    def thresholds(self) -> list[ThresholdsInForce]:
        """What each running camera keeps of its detections now (any thread)."""
        with self._lock:
            labels = self.manifest.labels if self.manifest else []
            return [
                in_force(s, pipeline.detector.detection_filter, labels, self._filter_problems.get(s.name, ()))
                for s in self.sections
                if (pipeline := self._pipelines.get(s.name)) is not None
            ]

    def motion(self) -> list[MotionView]:
        """Each running motion-gated camera's newest motion and its masks (any thread: a
        camera's `Gating.last` is a frozen `Motion` its inference thread replaces whole, so this
        reads one frame's or the next's, never a mix)."""
        with self._lock:
            return [
                motion_view(s, gating)
                for s in self.sections
                if (pipeline := self._pipelines.get(s.name)) is not None and (gating := pipeline.gating) is not None
            ]

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


def motion_view(section: CameraSection, gating: Gating) -> MotionView:
    """The snapshot's account of `section`'s gate: its newest `Motion` (regions rounded to a
    tenth of a pixel) with agent.yaml's masks and the gate's ratios."""
    motion, ratios = gating.last, gating.ratios()
    regions = motion.regions.tolist() if motion is not None else []
    masks = section.motion.masks if section.motion is not None else []
    return MotionView(
        camera=section.name,
        regions=tuple((round(x0, 1), round(y0, 1), round(x1, 1), round(y1, 1)) for x0, y0, x1, y1 in regions),
        masks=tuple(tuple((x, y) for x, y in polygon) for polygon in masks),
        changed=round(motion.changed, 4) if motion is not None else 0.0,
        recalibrated=motion.recalibrated if motion is not None else False,
        inferred_ratio=ratios.inferred_ratio,
        motion_ratio=ratios.motion_ratio,
    )
