"""The shadow: a candidate version run beside the serving one on the cameras' live frames, before
it switches (docs/quality.md). `Cameras.shadow` opens a `ShadowSession`; the deployer reads its
`reports()` and judges them (`agent.deployment.quality.ShadowJudge`), then `close`s it.

- **What runs**: the candidate loaded once (`agent.serving.loader.open_detector`, one call at a
  time, its threads limited by `one_thread`: ONNX Runtime's intra- and inter-op threads 1, no
  spinning; OpenVINO's and LiteRT's threads 1), each camera's own detection filter resolved
  against the candidate's manifest (`agent.serving.camera_filter`), so both versions keep
  detections on the same terms as the serving camera does.
- **Frames**: a sink on each camera's `Pipeline` offers every (frame, serving detections) it
  delivers that its model inferred (not those a motion gate let through); while the session is
  ready the newest one per camera is kept, while it infers or rests every offer is skipped
  (counted, never queued). One `pipelines.worker.Worker` thread
  (``shadow``) takes the pending camera served least lately, infers it and feeds that camera's
  `pipelines.measure.comparison.Agreement`.
- **CPU share**: after an inference of t seconds the thread rests t * (1/share - 1) (`rest_s`),
  so the candidate spends at most `share` of one core's time; at the default 0.1 the serving
  cameras keep >= 0.9 of their FPS. The rest lasts until its end on `clock`: a wake of the
  thread during it (an offer made while the thread was taking its frame) does not shorten it.
- **Latency**: the candidate's per frame (prepare, infer, decode) is in each report; the
  serving version's is the camera's own (`serving_latency_ms`: the medians of its stages over
  its last frames, on all the threads it serves with, so it is no like-for-like race).
- **Failures**: a candidate inference that raises counts for that camera as a frame on which
  the candidate found nothing (its recall falls, so a broken candidate disagrees rather than
  passing as quiet), is counted in `failures()` and logged once per camera; the thread goes on.
- **Second stage**: given `SecondStages` (both versions carry a classifier), each frame compared
  also classifies up to 4 crops of the reference's detections (the serving version's; with roles
  reversed, the loaded one's) with both classifiers, within the same share of time, and counts
  the crops whose top-1 labels are the same (`pipelines.measure.second_stage`). A classifier
  that raises is logged once; that frame's crops are left out.
- **Roles reversed** (``loaded_is="reference"``, probation's agreement check): the loaded model
  is the previous version, the reference, and the camera's own detections (the new version's)
  are the candidate's; the camera's latency is then the candidate's. A reference inference that
  raises is counted and its frame left out: it says nothing of the new version.

- **Samples**: given `disagreed` (the daemon's samples for retraining), each frame on which the
  two versions `disagree` (a box of either without a match of its class) is handed to it with
  the serving detections, on the shadow's thread (the hook must not wait).

Threads: the sinks run on the cameras' inference threads, the worker on its own; `reports`,
`failures` and `close` may be called from any thread (one lock around the pending frames and
the agreements).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import CameraDetector, Detector
from pipelines.measure.comparison import Agreement, AgreementReport
from pipelines.measure.evaluate import match
from pipelines.measure.second_stage import SecondStages, top1_same
from pipelines.pipeline import Pipeline, Sink
from pipelines.sources.frames import Frame
from pipelines.worker import DONE, Worker
from runtimes.registry import RuntimeSettings

log = logging.getLogger(__name__)

#: the shadow thread's idle wait when no frame is pending (a sink wakes it sooner)
IDLE_S = 1.0
#: how long `close` waits for the thread to end (seconds)
STOP_S = 10.0
#: the settings keys, across backends, of the threads one inference call may use
THREAD_KEYS = ("intra_op_threads", "inter_op_threads", "num_threads", "threads")


def one_thread(settings: RuntimeSettings, threads: int = 1) -> RuntimeSettings:
    """`settings` with every backend's threads per call set to `threads` (and ONNX Runtime's
    spinning off), so the candidate does not take the serving cameras' cores."""
    for config in settings.configs:
        fields = type(config).model_fields
        update: dict[str, object] = {key: threads for key in THREAD_KEYS if key in fields}
        if "spinning" in fields:
            update["spinning"] = False
        if update:
            settings = settings.replace(config.model_copy(update=update))
    return settings


def serving_latency_ms(pipeline: Pipeline) -> float | None:
    """The serving version's ms per frame on a camera: the medians of its preprocessing,
    inference and decoding over its last frames (the pipeline's latency window), summed; None
    before its first frame. The candidate's is measured per frame compared, on its one thread."""
    latency = pipeline.stats().latency_ms
    stages = [latency.get(stage) for stage in ("preprocess", "inference", "postprocess")]
    if any(stage is None for stage in stages):
        return None
    return round(sum(stage.p50 for stage in stages if stage is not None), 3)


def rest_s(took_s: float, share: float) -> float:
    """The rest after an inference of `took_s` seconds that keeps the candidate to `share` of
    the time (0 < share <= 1)."""
    return took_s * (1 / share - 1)


@dataclass(frozen=True)
class ShadowCamera:
    """One camera the shadow watches: its pipeline and the loaded model kept by its filter."""

    pipeline: Pipeline
    model: CameraDetector


#: the samples' hook: camera, the frame the two versions disagreed on, the serving detections
Disagreed = Callable[[str, Frame, Detections], None]


def disagree(serving: Detections, loaded: Detections, iou: float = 0.5) -> bool:
    """Whether one frame's detections of both versions disagree: a box of either without a
    match of its class in the other's at `iou` (the comparison's matching)."""
    return len(match(loaded, serving, iou)) < max(len(serving), len(loaded))


class ShadowSession:
    """The loaded `detector` on `cameras` (name -> `ShadowCamera`, each holding the same
    detector) at `share` of the time; `clock` times it (monotonic seconds). `loaded_is` says
    which side of the comparison it is (the module's "roles reversed"). `start` attaches the
    sinks and starts the thread; `close` undoes both and closes the detector."""

    def __init__(
        self,
        detector: Detector,
        cameras: Mapping[str, ShadowCamera],
        share: float,
        clock: Callable[[], float] = time.monotonic,
        loaded_is: Literal["candidate", "reference"] = "candidate",
        stages: SecondStages | None = None,
        disagreed: Disagreed | None = None,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be within (0, 1], got {share}")
        self.detector, self.cameras, self.share, self._clock = detector, dict(cameras), share, clock
        self.loaded_is, self.stages = loaded_is, stages
        self.disagreed = disagreed  # samples for retraining: told of each frame the two disagreed on
        self._stage_failed = False
        self._lock = threading.Lock()
        self._agreements = {name: Agreement() for name in self.cameras}
        self._failures = dict.fromkeys(self.cameras, 0)
        self._pending: dict[str, tuple[Frame, Detections]] = {}
        self._served_at = dict.fromkeys(self.cameras, 0)  # turn at which each camera was last inferred
        self._turns = 0
        self._ready = True  # False while inferring or resting: offers are skipped
        self._rests_until: float | None = None  # on `clock`: a wake before then does not end the rest
        self.skipped = 0  # frames offered while busy or resting
        self._sinks: dict[str, Sink] = {}
        self._worker = Worker("shadow", self._turn, described="the shadow (a candidate version)", budget_s=None)
        self._closed = False

    # -- life ----------------------------------------------------------------------------------

    def start(self) -> ShadowSession:
        for name, camera in self.cameras.items():
            sink = self._sink(name)
            self._sinks[name] = sink
            camera.pipeline.add_sink(sink)
        self._worker.start()
        return self

    @property
    def closed(self) -> bool:
        return self._closed

    def move(self, name: str, pipeline: Pipeline) -> None:
        """Camera `name` was restarted as `pipeline` (a restart command, a new worker count):
        offer its frames from now on, so the camera is not read as quiet (any thread)."""
        with self._lock:
            camera = self.cameras.get(name)
            if camera is None or self._closed or camera.pipeline is pipeline:
                return
            self.cameras[name] = replace(camera, pipeline=pipeline)
            sink = self._sinks[name]
        camera.pipeline.remove_sink(sink)
        pipeline.add_sink(sink)

    def close(self) -> None:
        """Remove the sinks, stop the thread (within `STOP_S`), close the candidate. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            cameras = dict(self.cameras)
        for name, sink in self._sinks.items():
            cameras[name].pipeline.remove_sink(sink)
        stopped = self._worker.stop(STOP_S)
        if stopped:  # a thread still inferring keeps its runtime; it is reported by the worker
            self.detector.close()
            if self.stages is not None:
                self.stages.close()

    # -- what it found (any thread) ------------------------------------------------------------

    def reports(self) -> dict[str, AgreementReport]:
        """Each camera's comparison so far, the camera's own latency now (`serving_latency_ms`)
        its `serving_ms` (its `candidate_ms` with roles reversed)."""
        with self._lock:
            reports = {name: agreement.report() for name, agreement in self._agreements.items()}
            pipelines = {name: camera.pipeline for name, camera in self.cameras.items()}
        if self.loaded_is == "reference":
            return {name: replace(r, candidate_ms=serving_latency_ms(pipelines[name])) for name, r in reports.items()}
        return {name: replace(r, serving_ms=serving_latency_ms(pipelines[name])) for name, r in reports.items()}

    def failures(self) -> dict[str, int]:
        """Each camera's candidate inferences that raised so far."""
        with self._lock:
            return dict(self._failures)

    # -- the sinks (the cameras' inference threads) --------------------------------------------

    def _sink(self, name: str) -> Sink:
        def offer(frame: Frame, detections: Detections) -> None:
            if not frame.inferred:  # the motion gate's: the serving model did not run on it
                return
            with self._lock:
                if not self._ready:
                    self.skipped += 1
                    return
                if name in self._pending:
                    self.skipped += 1  # replaced by the newer frame before the thread took it
                self._pending[name] = (frame, detections)
            self._worker.wake()

        return offer

    # -- the thread ----------------------------------------------------------------------------

    def _take(self) -> tuple[str, Frame, Detections] | None:
        """The pending frame of the camera served least lately (the others' are skipped)."""
        with self._lock:
            if not self._ready:  # the rest is over
                self._ready = True
                return None
            if not self._pending:
                return None
            name = min(self._pending, key=lambda n: self._served_at[n])
            frame, serving = self._pending.pop(name)
            self.skipped += len(self._pending)
            self._pending.clear()
            self._ready = False
            self._turns += 1
            self._served_at[name] = self._turns
            return name, frame, serving

    def _turn(self) -> float | None:
        if self._worker.stopping.is_set():
            return DONE
        if self._rests_until is not None and (left := self._rests_until - self._clock()) > 0:
            return left  # woken during the rest: an offer made while the last frame was being taken
        taken = self._take()
        if taken is None:
            return 0.0 if self._ready and self._pending else IDLE_S
        name, frame, serving = taken
        model = self.cameras[name].model
        start = self._clock()
        try:
            tensor, transform = model.prepare(frame.image)
            loaded: Detections | None = model.postprocess(model.infer(tensor), transform)
        except Exception:
            loaded = None
            with self._lock:
                self._failures[name] += 1
                first = self._failures[name] == 1
            if first:
                log.exception(
                    "shadow: the %s failed on camera %s (counted; further failures not logged)", self.loaded_is, name
                )
        same = self._second_stage(frame, serving if self.loaded_is == "candidate" else loaded)
        ended = self._clock()
        took = ended - start
        if self.disagreed is not None and loaded is not None and disagree(serving, loaded):
            self.disagreed(name, frame, serving)
        with self._lock:
            self._agreements[name].add_crops(same)
            if self.loaded_is == "candidate":
                self._agreements[name].add(serving, Detections.empty() if loaded is None else loaded, None, took * 1000)
            elif loaded is not None:  # the loaded model is the reference: the camera's is the candidate
                self._agreements[name].add(loaded, serving, took * 1000, None)
        rest = rest_s(took, self.share)
        self._rests_until = ended + rest
        return rest

    def _second_stage(self, frame: Frame, reference: Detections | None) -> list[bool]:
        """Whether both second stages named each crop of `reference`'s detections alike (none
        without `stages`, or when the frame was not compared)."""
        if self.stages is None or reference is None:
            return []
        try:
            return top1_same(frame.image, reference, self.stages)
        except Exception:
            if not self._stage_failed:
                self._stage_failed = True
                log.exception("shadow: a second stage failed on a crop (its crops are left out; not logged again)")
            return []
