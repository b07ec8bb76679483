"""The camera-to-detection pipeline: a capture thread and one or more inference threads per camera.

- Live sources (cameras, streams): the capture thread keeps only the newest frame; a frame
  replaced before inference took it counts as dropped.
- Files and benchmark clips: every frame is processed; the capture thread also preprocesses,
  so decoding and letterboxing overlap with inference (a queue of two prepared frames).

An inference thread runs preprocess (when not done yet) -> infer -> decode + NMS, records
per-stage latency and FPS, and hands each frame's `Detections` to the sinks. With `workers` > 1
several frames are in flight at once on one model (runtimes that allow it), and results still
reach the sinks in frame order. Pause/resume, an FPS cap and a model swap between frames are
safe to call from any thread; a detector swapped out is retired (by default closed: its
runtime, or its camera's hold on a shared model) once no frame in flight uses it. A failing
source is reopened with jittered backoff; nothing here raises into the caller's thread.

Motion gate (optional, `Pipeline(gating=...)`, docs/cameras.md "Motion"): a frame in which
nothing moved, with no track due for its keepalive nor the idle interval, is not inferred; its
sinks get it with the last inferred frame's detections (`Frame.inferred` False), so trackers,
lines, zones and rates go on as for a still scene. With `regions` too (`pipelines.regions`), a
frame admitted with motion is inferred on crops around what moved, one inference per crop, and
their boxes are mapped back and merged, with the last frame's detections outside every crop kept;
a full frame on `RegionSchedule`'s schedule and whenever the gate admits without motion. Box
detectors only: a model of another task runs on full frames (logged once).

Camera health (optional, `Pipeline(health=...)`, docs/cameras.md "Camera health"): every frame
the source delivers is offered, on the capture thread, to the camera's
`pipelines.health_watch.HealthWatch`, which judges one every `interval_s`; its newest state is in
`PipelineStats.health`.

Unusable output: a frame whose inference output is all NaN (a floating output with no finite
value) or cannot be decoded (the wrong shape for the decoder, a runtime or plugin that returns
garbage) counts as failed and as a bad output (`PipelineStats.bad_outputs`, the last reason in
`bad_output`), which the page shows as a problem and probation fails a version for. A failing
frame is logged once with its traceback, then as a count at most once per `FAILURE_LOG_EVERY_S`
(a model that fails every frame writes two lines a minute, not one traceback a frame).

Liveness: every thread beats a heartbeat at each turn of its loop, announcing how long the wait
it is about to start may last (a backoff, the FPS cap, a pause); `PipelineStats.stalled_s` is how
far the most overdue thread is past its announced turn, so a read or an inference that never
returns shows as a growing number while waiting, pausing and reconnecting never do.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from pipelines.annotate import BoxAnnotator, encode_jpeg
from pipelines.backoff import Backoff
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import FrameDetector, model_input_hw
from pipelines.decoding.preprocess import Transform
from pipelines.detection_rates import DetectionRates, Rates
from pipelines.gating import GateRatios, Gating
from pipelines.health_watch import HealthState, HealthWatch
from pipelines.latency import FpsMeter, LatencyWindow, Percentiles
from pipelines.regions import Crop, RegionSchedule, carry_over, merge_crop_detections
from pipelines.sources.frames import Frame, FrameSource, SourceError, SourceState, SourceStatus
from pipelines.worker import DONE, Worker
from runtimes.base import Runtime

log = logging.getLogger(__name__)

Sink = Callable[[Frame, Detections], None]
#: after the first, a frame's failure of one kind is logged as a count at most this often (seconds)
FAILURE_LOG_EVERY_S = 60.0


def use_one_opencv_thread() -> None:
    """Make OpenCV run its resize and colour conversion on the calling thread only.

    OpenCV's default thread pool spreads each call over every core, where the runtime's own
    threads are busy with inference; on a 2-core board that contention cost the fixed-model
    pipeline about 5 % of its FPS (docs/benchmarks.md). Process-wide, so the programs that run
    pipelines (the daemon, ``edge-agent bench``) call it once at start.
    """
    import cv2

    cv2.setNumThreads(1)


@dataclass(frozen=True)
class _Prepared:
    frame: Frame
    tensor: npt.NDArray[Any] | None = None
    transform: Transform | None = None
    detector: FrameDetector | None = None  # the detector whose preprocessing made `tensor`
    prepare_s: float = 0.0  # how long that preprocessing took
    crops: tuple[Crop, ...] | None = None  # inferred on these crops (regions), not the whole frame


_END = object()  # the source has no more frames


@dataclass(frozen=True)
class _Result:
    frame: Frame
    detections: Detections | None  # None: inference failed on this frame
    latency_ms: dict[str, float]
    bad_output: str | None = None  # why the model's output was unusable (None: it was, or it failed before)
    detector: FrameDetector | None = None  # the detector that inferred it
    replay: bool = False  # not inferred (the motion gate): the sinks get the last inferred frame's detections
    crops: tuple[Crop, ...] | None = None  # inferred on these crops: the last detections outside them stand


class _FailureLog:
    """One pipeline's failed frames in its log: the first of each kind with its traceback, then
    how many more at most once per `every_s` seconds of `clock`. Thread-safe."""

    def __init__(self, name: str, clock: Callable[[], float], every_s: float = FAILURE_LOG_EVERY_S) -> None:
        self.name, self._clock, self.every_s = name, clock, every_s
        self._lock = threading.Lock()
        self._logged: dict[str, float] = {}  # kind -> when a line of it was last logged
        self._held: dict[str, int] = {}  # kind -> failures not logged since

    def failed(self, kind: str, frame: int, why: str, error: BaseException | None = None) -> None:
        now = self._clock()
        with self._lock:
            first, last = kind not in self._logged, self._logged.get(kind, now)
            if not first and now - last < self.every_s:
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            self._logged[kind], held = now, self._held.pop(kind, 0) + (0 if first else 1)
        if first:
            log.error("pipeline %s: %s on frame %d: %s", self.name, kind, frame, why, exc_info=error)
        else:
            log.error("pipeline %s: %s on %d more frames (last: frame %d: %s)", self.name, kind, held, frame, why)


def unusable_output(outputs: Sequence[npt.NDArray[Any]]) -> str | None:
    """Why a model's raw `outputs` cannot be detections: a floating output all NaN or infinite
    (a broken runtime, plugin or export); None when none is."""
    for index, output in enumerate(outputs):
        array = np.asarray(output)
        if array.size and np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).any():
            return f"output {index} {tuple(array.shape)} is all NaN or infinite"
    return None


@dataclass(frozen=True)
class PipelineStats:
    """One camera at one moment: `fps` over the last seconds, counters since it started
    (`frames` handed to the sinks, `dropped` replaced before inference, `errors` failed,
    `swaps` of the model), per-stage latency percentiles in ms, the capture side, and the runtime
    and model file it serves with, and how many cameras that model serves and in what batches.
    With a motion gate (`pipelines.gating`), `frames` and `fps` count the frames it let through
    without inference too (their sinks got the last detections), `inferred` those the model
    ran on, and `gate` its ratios; without one both are None (every frame handed on was inferred)."""

    name: str
    source: str
    fps: float
    frames: int
    dropped: int
    errors: int
    swaps: int
    paused: bool
    max_fps: float | None
    workers: int
    latency_ms: dict[str, Percentiles]
    source_status: SourceState
    runtime: str
    model: str
    shared_by: int = 1  # cameras served by this camera's model (1: a model of its own)
    mean_batch: float = 1.0  # frames per inference call on that model since it was loaded
    stalled_s: float = 0.0  # how long its most overdue thread is past its announced turn (0: all on time)
    in_view: dict[str, int] = field(default_factory=dict)
    bad_outputs: int = 0  # of the `errors`, frames whose output was all NaN or could not be decoded
    bad_output: str | None = None  # why the last of them was unusable
    rates: Rates = field(default_factory=Rates)  # confident detections lately, under the model serving now
    inferred: int | None = None  # frames the model ran on (None: as `frames`, no gate)
    gate: GateRatios | None = None
    health: HealthState | None = None  # the camera's health check's newest state (None: off, or not yet)


class Pipeline:
    """One camera's detection loop. `max_fps` caps inference (``None``: as fast as possible);
    `sinks` are called with every processed frame and its detections, in frame order, from an
    inference thread.

    `workers` is the number of inference threads sharing the detector. One keeps each frame's
    latency lowest; more trade latency for throughput when one inference cannot use every core
    (e.g. two ONNX Runtime calls of one thread each on a 2-core board, docs/benchmarks.md).
    More than one needs a runtime whose `infer` may run concurrently (`Runtime.concurrent`).

    `retire` is called (from an inference thread, or the caller of `swap_detector` / `stop`)
    with each detector the pipeline stops using: swapped out, or replaced before it served. The
    default closes it (`FrameDetector.close`: a `Detector` closes its runtime, a shared model's
    `CameraModel` lets go of the model); the detector serving when the pipeline stops is left
    to the caller.

    `gating`, a camera's motion gate (`pipelines.gating`), is asked for each frame taken, after
    the FPS cap: a frame it does not admit is not prepared nor inferred, and is handed to the
    sinks in its place in the order with the last inferred frame's detections (`Frame.inferred`
    False); a file's frames are then judged on the file's own time (index / its FPS).

    `health`, a camera's health check (`pipelines.health_watch`), is offered every frame read,
    on the capture thread, before the frame is handed on.

    `regions` (with `gating` only) infers the frames it admits with motion on crops around the
    motion (`pipelines.regions.RegionSchedule`, box detectors only).
    """

    def __init__(
        self,
        name: str,
        source: FrameSource,
        detector: FrameDetector,
        *,
        max_fps: float | None = None,
        sinks: Sequence[Sink] = (),
        annotator: BoxAnnotator | None = None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        workers: int = 1,
        retire: Callable[[FrameDetector], None] = lambda detector: detector.close(),
        gating: Gating | None = None,
        health: HealthWatch | None = None,
        regions: RegionSchedule | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"pipeline {name}: workers must be at least 1, got {workers}")
        if workers > 1 and not detector.runtime.concurrent:
            raise ValueError(
                f"pipeline {name}: {detector.runtime.name} cannot run one model from {workers} threads at once; "
                "use workers: 1"
            )
        self.name, self.source, self.workers = name, source, workers
        self._detector = detector
        self._pending_detector: FrameDetector | None = None
        self._retire = retire
        self._in_flight: dict[FrameDetector, int] = {}  # frames being inferred, per detector (under _lock)
        self._retiring: list[FrameDetector] = []  # swapped out, waiting for their frames in flight
        self.max_fps = max_fps
        self._sinks = list(sinks)
        self._annotator = annotator or BoxAnnotator()
        self._backoff = backoff or Backoff()
        self._clock = clock
        self.source_status = SourceStatus()
        self.latency = LatencyWindow()
        self.fps_meter = FpsMeter(clock=clock)
        self.gating = gating
        self.health = health
        self.regions = regions if gating is not None else None
        self._regions_refused = False  # a model of another task than boxes was logged (once)
        self.frames = 0
        self.inferred = 0
        self.dropped = 0
        self.errors = 0
        self.bad_outputs = 0
        self.bad_output: str | None = None
        self._failures = _FailureLog(name, clock)
        self.swaps = 0
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._newest: Any = None  # live mode: the newest frame, or _END
        self._newest_ready = threading.Condition(self._lock)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._take_lock = threading.Lock()  # inference threads take frames one at a time
        self._taken = 0  # sequence number of the next frame taken
        self._ended = False  # an inference thread took the end of the source
        self._next_due = 0.0  # the FPS cap's next slot, in clock seconds
        self._results_lock = threading.Lock()
        self._results: dict[int, _Result] = {}  # finished out of order, waiting for earlier frames
        self._delivered = 0  # sequence number of the next result the sinks get
        self._working = 0  # inference threads still running
        self._latest: tuple[Frame, Detections] | None = None
        self._rates = DetectionRates(clock)  # of the detector whose results were delivered last
        self._rates_of: FrameDetector | None = None
        self._threads: list[Worker] = []  # capture, then the inference threads: each a whole loop
        self._due: dict[str, float] = {}  # running thread's name -> clock time it promised to turn by

    # -- control ---------------------------------------------------------------------------

    def start(self) -> Pipeline:
        self._working, self._next_due = self.workers, self._clock()
        capture = Worker(
            f"capture-{self.name}", self._capture_turn, described=f"camera {self.name}'s capture", budget_s=None
        )
        self._threads = [capture] + [
            Worker(
                f"infer-{self.name}-{i}",
                self._inference_turn,
                described=f"camera {self.name}'s inference",
                budget_s=None,
            )
            for i in range(self.workers)
        ]
        self._due = {thread.name: self._clock() for thread in self._threads}
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the capture and inference threads and close the source (idempotent)."""
        self._stop.set()
        self._running.set()
        with self._newest_ready:
            self._newest_ready.notify_all()
        for thread in self._threads:
            thread.stop(timeout)
        self.source.close()
        if self.source_status.state != "ended":
            self.source_status.set("stopped")
        with self._lock:
            unused = [d for d in (self._pending_detector, *self._retiring) if d is not None]
            self._pending_detector, self._retiring = None, []
        for detector in unused:
            self._retire(detector)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a finite source is fully processed (or `stop`); True when done."""
        return self._done.wait(timeout)

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def swap_detector(self, detector: FrameDetector) -> None:
        """Use `detector` from the next frame on; capture never stops. With several workers the
        new runtime must allow concurrent calls too (`ValueError` otherwise)."""
        if self.workers > 1 and not detector.runtime.concurrent:
            raise ValueError(
                f"pipeline {self.name}: {detector.runtime.name} cannot serve {self.workers} workers; "
                "restart the pipeline with 1"
            )
        with self._lock:
            replaced, self._pending_detector = self._pending_detector, detector
        if replaced is not None:
            self._retire(replaced)  # never served

    @property
    def detector(self) -> FrameDetector:
        return self._detector

    def add_sink(self, sink: Sink) -> None:
        """Call `sink` with every frame processed from now on (any thread)."""
        self._sinks = [*self._sinks, sink]  # a new list: an inference thread may be iterating the old

    def remove_sink(self, sink: Sink) -> None:
        """Stop calling `sink` (any thread; a frame being delivered may still reach it)."""
        self._sinks = [s for s in self._sinks if s is not sink]

    # -- results ---------------------------------------------------------------------------

    def snapshot(self, quality: int = 85) -> bytes | None:
        """The newest processed frame with its detections drawn, as JPEG; None before the first."""
        latest = self._latest
        if latest is None:
            return None
        frame, detections = latest
        return encode_jpeg(self._annotator.annotate(frame.image, detections), quality)

    def stats(self) -> PipelineStats:
        """Numbers for telemetry and the status page (any thread)."""
        runtime = self._detector.runtime
        return PipelineStats(
            name=self.name,
            source=self.source.name,
            fps=round(self.fps_meter.fps, 2),
            frames=self.frames,
            dropped=self.dropped,
            errors=self.errors,
            bad_outputs=self.bad_outputs,
            bad_output=self.bad_output,
            swaps=self.swaps,
            paused=self.paused,
            max_fps=self.max_fps,
            workers=self.workers,
            latency_ms=self.latency.percentiles(),
            source_status=self.source_status.snapshot(),
            runtime=runtime.name,
            model=runtime.model_path.name,
            stalled_s=self._stalled_s(),
            in_view=self._in_view(),
            rates=self._rates.rates(),
            inferred=self.inferred if self.gating is not None else None,
            gate=self.gating.ratios() if self.gating is not None else None,
            health=self.health.state if self.health is not None else None,
        )

    def _in_view(self) -> dict[str, int]:
        """The newest processed frame's detections counted by label, named as the annotator names them."""
        latest = self._latest
        if latest is None or self.paused:
            return {}
        counts: dict[str, int] = {}
        for class_id, n in zip(*np.unique(latest[1].class_id, return_counts=True), strict=True):
            label = self._annotator.label(int(class_id))
            counts[label] = counts.get(label, 0) + int(n)
        return counts

    def _beat(self, wait_s: float = 0.0) -> None:
        """The calling thread turned and will turn again within `wait_s` seconds (the wait it
        is about to start; ``math.inf``: it waits on a sibling whose own beat tells)."""
        self._due[threading.current_thread().name] = self._clock() + wait_s

    def _leave(self) -> None:
        """The calling thread leaves its loop: it no longer counts for `stalled_s`."""
        self._due.pop(threading.current_thread().name, None)

    def _stalled_s(self) -> float:
        due = list(self._due.values())  # one C-level copy: safe against a thread leaving meanwhile
        return round(max(0.0, self._clock() - min(due)), 3) if due else 0.0

    # -- threads ---------------------------------------------------------------------------

    def _capture_turn(self) -> float | None:
        """The capture worker's one turn: the whole loop, until the source ends or `stop`."""
        try:
            self._capture_turns()
        finally:
            self._leave()
        return DONE

    def _capture_turns(self) -> None:
        opened = False
        while not self._stop.is_set():
            self._beat()
            try:
                if not opened:
                    self.source.open()
                    opened = True
                    self.source_status.set("running")
                    self._backoff.reset()
                frame = self.source.read()
            except SourceError as exc:
                opened = self._source_failed(str(exc), exc.output)
                continue
            except Exception as exc:  # a driver bug must not kill the camera thread
                log.exception("pipeline %s: unexpected source failure", self.name)
                opened = self._source_failed(f"{type(exc).__name__}: {exc}")
                continue
            if frame is None:
                self.source_status.set("ended")
                self._deliver(_END)
                return
            if self.health is not None and not self._stop.is_set():  # a restarted camera's new thread has it
                self.health.offer(frame)
            self._hand_over(frame)
            del frame  # not held while the next read waits: the inference threads may be done with it

    def _hand_over(self, frame: Frame) -> None:
        """`frame` to the inference threads, prepared first when from a file (not with a motion
        gate: a frame it lets through is never prepared)."""
        if self.source.live or self.gating is not None:
            self._deliver(_Prepared(frame))
        else:
            detector = self._detector
            start = self._clock()
            tensor, transform = detector.prepare(frame.image)
            self._deliver(_Prepared(frame, tensor, transform, detector, self._clock() - start))

    def _source_failed(self, error: str, output: Sequence[str] = ()) -> bool:
        self.source_status.set("reconnecting", error, output)
        log.warning("pipeline %s: source failed: %s; reconnecting", self.name, error)
        self.source.close()
        delay = self._backoff.next_delay()
        self._beat(delay)
        self._stop.wait(delay)
        return False

    def _deliver(self, item: Any) -> None:
        if self.source.live:
            with self._newest_ready:
                if self._newest is not None and self._newest is not _END:
                    self.dropped += 1
                self._newest = item
                self._newest_ready.notify()
            return
        while not self._stop.is_set():
            self._beat(0.1)
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _next_item(self) -> Any:
        if self.source.live:
            with self._newest_ready:
                while self._newest is None and not self._stop.is_set():
                    self._beat(0.1)
                    self._newest_ready.wait(0.1)
                item, self._newest = self._newest, None
                return item
        while not self._stop.is_set():
            self._beat(0.1)
            try:
                return self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
        return None

    def _inference_turn(self) -> float | None:
        """An inference worker's one turn: the whole loop, until the source ends or `stop`."""
        self._inference_loop()
        return DONE

    def _inference_loop(self) -> None:
        while self._serve_next():
            pass
        self._leave()
        with self._results_lock:
            self._working -= 1
            if self._working == 0:
                self._done.set()

    def _serve_next(self) -> bool:
        """Take the next frame, run it and hand its result on; False once there is none. What it
        held (the frame, its tensors and outputs) is let go when it returns, so a thread waiting
        for the next frame holds none of them: in a loop, the last frame's names would keep it
        (a 720p frame and its tensor: 4 MB per inference thread)."""
        taken = self._take()
        if taken is None:
            return False
        seq, item, detector = taken
        self._beat()  # inference and the sinks: no announced wait, a hang shows
        try:
            result = self._process(item, detector)
        finally:
            self._release(detector)
        self._finish(seq, result)
        return True

    def _take(self) -> tuple[int, _Prepared, FrameDetector] | None:
        """The next frame, its sequence number and the detector to run, once pause and the FPS
        cap allow; None when the source ended or the pipeline stops."""
        self._beat(math.inf)  # a sibling holding the take lock beats for both
        with self._take_lock:
            while True:
                self._beat()
                item = None
                while item is None and not self._ended and not self._stop.is_set():
                    item = self._next_item()
                if item is _END:
                    self._ended = True
                while not self._running.is_set():  # paused: waiting, not hanging
                    self._beat(1.0)
                    self._running.wait(1.0)
                if self._ended or self._stop.is_set() or item is None:
                    return None
                self._pace()
                admitted = self._admitted(item)
                if admitted is not None:
                    item = admitted
                    break
            with self._lock:
                if self._pending_detector is not None:
                    self._retiring.append(self._detector)
                    self._detector, self._pending_detector = self._pending_detector, None
                    self.swaps += 1
                detector = self._detector
                self._in_flight[detector] = self._in_flight.get(detector, 0) + 1
            self._retire_idle()
            self._taken += 1
            return self._taken - 1, item, detector

    def _pace(self) -> None:
        """Wait for the FPS cap's next slot (none without a cap)."""
        if self.max_fps:
            delay = self._next_due - self._clock()
            if delay > 0:
                self._beat(delay)
                self._stop.wait(delay)
            self._next_due = max(self._next_due + 1.0 / self.max_fps, self._clock() - 1.0 / self.max_fps)

    def _admitted(self, item: _Prepared) -> _Prepared | None:
        """`item` if the motion gate lets it be inferred (always without a gate), with the crops
        to infer it on (regions); None for a frame it does not, handed on in order with the last
        inferred frame's detections."""
        gating = self.gating
        if gating is None:
            return item
        frame = item.frame
        fps = None if self.source.live else getattr(self.source, "fps", None)
        now = frame.index / fps if fps else frame.timestamp  # a file's own time: its frames are not paced
        if gating.admit(frame.pixels, now):  # a JPEG frame not admitted is never decoded whole
            return self._with_crops(item, now, gating)
        self._taken += 1
        self._finish(self._taken - 1, _Result(replace(frame, inferred=False), None, {}, replay=True))
        return None

    def _with_crops(self, item: _Prepared, now: float, gating: Gating) -> _Prepared:
        """`item` with the crops `regions` plans for its motion (unchanged: a full frame)."""
        regions = self.regions
        runtime = self._detector.runtime
        if regions is None or not self._boxes_only(runtime):
            return item
        image = item.frame.image
        crops = regions.plan(now, gating.last, image.shape[:2], model_input_hw(runtime))
        return item if crops is None else replace(item, crops=crops, tensor=None, transform=None, detector=None)

    def _boxes_only(self, runtime: Runtime) -> bool:
        """Whether `runtime`'s model is a box detector (task ``detect``, or none named), whose
        crops' boxes map back by an offset; another task's is logged, once, and runs full frames."""
        task = runtime.metadata.task
        if task in (None, "detect"):
            return True
        if not self._regions_refused:
            self._regions_refused = True
            log.warning(
                "pipeline %s: motion.regions is for box detectors; this %s model runs on full frames", self.name, task
            )
        return False

    def _release(self, detector: FrameDetector) -> None:
        """One frame on `detector` is done; retire the swapped-out detectors no frame uses."""
        with self._lock:
            self._in_flight[detector] -= 1
            if self._in_flight[detector] == 0:
                del self._in_flight[detector]
        self._retire_idle()

    def _retire_idle(self) -> None:
        with self._lock:
            idle = [d for d in self._retiring if d not in self._in_flight]
            self._retiring = [d for d in self._retiring if d in self._in_flight]
        for detector in idle:
            try:
                self._retire(detector)
            except Exception:
                log.exception("pipeline %s: retiring %s failed", self.name, detector.runtime.model_path.name)

    def _process(self, item: _Prepared, detector: FrameDetector) -> _Result:
        """Infer `item`'s frame, or each of its crops (their boxes mapped back and merged)."""
        start = self._clock()
        image = item.frame.image
        parts: list[tuple[Crop | None, Detections]] = []
        spent = [0.0, 0.0, 0.0]  # seconds preprocessing, inferring, decoding
        if item.crops is not None and not self._boxes_only(detector.runtime):  # swapped to another task
            item = replace(item, crops=None)
        for crop in item.crops or (None,):
            pieces = image if crop is None else crop.cut(image)
            prepared_item = item if crop is None else _Prepared(item.frame)
            part = self._infer_one(prepared_item, pieces, detector, spent)
            if isinstance(part, _Result):
                return part
            parts.append((crop, part))
        if item.crops is None:
            detections = parts[0][1]
        else:
            keep = detector.detection_filter
            per_crop = [(crop, found) for crop, found in parts if crop is not None]
            detections = merge_crop_detections(per_crop, image.shape[:2], keep.iou, keep.max_det)
        done = self._clock()
        latency_ms = {
            "capture_age": (start - item.frame.timestamp) * 1000,
            "preprocess": spent[0] * 1000,
            "inference": spent[1] * 1000,
            "postprocess": spent[2] * 1000,
            "total": (done - item.frame.timestamp) * 1000,
        }
        return _Result(item.frame, detections, latency_ms, detector=detector, crops=item.crops)

    def _infer_one(
        self, item: _Prepared, image: npt.NDArray[Any], detector: FrameDetector, spent: list[float]
    ) -> Detections | _Result:
        """`image` (the frame, or a crop of it) through `detector`: its detections in its own
        pixels, with the seconds of each stage added to `spent`; a failed `_Result` instead."""
        start = self._clock()
        try:
            if item.detector is detector and item.tensor is not None and item.transform is not None:
                tensor, transform, prepare_s = item.tensor, item.transform, item.prepare_s
            else:
                tensor, transform = detector.prepare(image)
                prepare_s = self._clock() - start
            prepared = self._clock()
            outputs = detector.infer(tensor)
            inferred = self._clock()
        except Exception as exc:
            self._failures.failed("inference failed", item.frame.index, f"{type(exc).__name__}: {exc}"[:300], exc)
            return _Result(item.frame, None, {})
        bad, error = unusable_output(outputs), None
        if bad is None:
            try:
                detections = detector.postprocess(outputs, transform)
            except Exception as exc:  # the wrong shape for the decoder, or garbage: the output's fault
                bad, error = f"its output cannot be decoded: {type(exc).__name__}: {exc}"[:300], exc
        if bad is not None:
            self._failures.failed("unusable model output", item.frame.index, bad, error)
            return _Result(item.frame, None, {}, bad)
        spent[0] += prepare_s
        spent[1] += inferred - prepared
        spent[2] += self._clock() - inferred
        return detections

    def _finish(self, seq: int, result: _Result) -> None:
        """Hand results to the sinks in frame order: a frame finished early waits for the
        earlier ones, and whichever thread completes the run delivers all of it."""
        with self._results_lock:
            self._results[seq] = result
            while self._delivered in self._results:
                self._deliver_result(self._results.pop(self._delivered))
                self._delivered += 1

    def _deliver_result(self, result: _Result) -> None:
        if result.replay:  # nothing moved: the last inferred frame's detections stand
            detections = self._latest[1] if self._latest is not None else Detections.empty()
        elif result.detections is None:
            self.errors += 1
            if result.bad_output is not None:
                self.bad_outputs += 1
                self.bad_output = result.bad_output
            return
        else:
            detections = result.detections
            if result.crops is not None and self._latest is not None and result.detector is not None:
                max_det = result.detector.detection_filter.max_det  # nothing moved outside the crops
                detections = carry_over(detections, self._latest[1], result.crops, max_det)
            self.latency.record(**result.latency_ms)
            self.inferred += 1
            if result.detector is not self._rates_of:  # the first result of a detector swapped in
                self._rates, self._rates_of = DetectionRates(self._clock), result.detector
        self.frames += 1
        self.fps_meter.tick()
        self._latest = (result.frame, detections)
        self._rates.add(detections)
        for sink in self._sinks:
            try:
                sink(result.frame, detections)
            except Exception:
                log.exception("pipeline %s: sink %r failed", self.name, sink)
