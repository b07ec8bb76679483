"""The second stage: a bundle's classifier run on each confirmed track's crop (docs/analytics.md).

A camera's inference thread hands `ClassifyingStage.offer` each tracked object of a frame; the
stage decides by its `ClassifySchedule` whether the object is due (once when first offered,
i.e. when its track is confirmed, then again every ``classifier.every_s`` seconds of the
injected `clock`, not before), crops the frame with the track's box
(`pipelines.tracking.analytics.crop_box`) and queues the crop. Its own thread, ``classify``,
runs the classifier on the queued crops oldest first and keeps each object's latest answer, an
`agent.event_values.ObjectClass`, which the object's events carry (`result`).

Threads: `offer`, `result` and `forget` are called from the cameras' inference threads and never
wait for a classification: the queue is bounded (`capacity`), and when it is full the oldest
request is dropped and counted (`dropped`). `serve` (a version activated, the governor's lighter
artifact) from any thread: it waits for the classification in progress, if any, before the old
model is closed. `loop` (health) from any thread. Memory: one schedule entry and one answer per
live track; `forget` (its track ended) drops both, and an answer that arrives after its track
ended is discarded.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from agent.event_values import ObjectClass
from agent.serving.loader import LoadedClassifier
from pipelines.tracking.analytics import crop_box
from pipelines.worker import LoopState, Worker

log = logging.getLogger(__name__)

NAME = "the classify thread (the second stage)"
THREAD = "classify"
#: crops waiting for the classifier, at most (the oldest is dropped past it)
CAPACITY = 64

Key = tuple[str, int]  # (camera, tracker id)


class ClassifySchedule:
    """When each object is classified: at its first `due` (its track just confirmed), then again
    once `every_s` seconds have passed since its last classification was asked for (at exactly
    `every_s`: due). Pure bookkeeping over the times it is given; one thread at a time."""

    def __init__(self, every_s: float) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be above 0 seconds, got {every_s}")
        self.every_s = every_s
        self._asked: dict[Hashable, float] = {}

    def due(self, key: Hashable, now: float) -> bool:
        """Whether `key` is to be classified at `now` (seconds); if so, `now` counts as asked."""
        asked = self._asked.get(key)
        if asked is not None and now - asked < self.every_s:
            return False
        self._asked[key] = now
        return True

    def forget(self, key: Hashable) -> bool:
        """Drop `key` (its track ended); whether it was known."""
        return self._asked.pop(key, None) is not None

    def __contains__(self, key: object) -> bool:
        return key in self._asked

    def __len__(self) -> int:
        return len(self._asked)


@dataclass(frozen=True)
class Request:
    """One crop to classify: whose (`key`), the BGR pixels, and when it was asked for (`asked`,
    the stage's clock, seconds)."""

    key: Key
    crop: npt.NDArray[np.uint8]
    asked: float


@dataclass(frozen=True)
class StageCounts:
    """What the stage did: crops queued (`requested`), classified, dropped because the queue was
    full (the oldest each time), failed (the classifier raised), and the total seconds spent
    classifying (`busy_s`)."""

    requested: int
    classified: int
    dropped: int
    failed: int
    busy_s: float


class ClassifyingStage:
    """The second stage of the cameras' analytics (see the module text). `clock` is monotonic
    seconds (injected in tests); `capacity` the queue's bound."""

    def __init__(self, capacity: int = CAPACITY, clock: Callable[[], float] = time.monotonic) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity, self._clock = capacity, clock
        self._cond = threading.Condition()  # the queue, the schedule, the answers, the counters
        self._queue: deque[Request] = deque()
        self._answers: dict[Key, ObjectClass] = {}
        self._schedule: ClassifySchedule | None = None
        self._loaded: LoadedClassifier | None = None
        self._for: frozenset[str] = frozenset()
        self._model_lock = threading.Lock()  # held while the classifier runs; `serve` waits on it
        self._worker = Worker(THREAD, self._turn, described=NAME, budget_s=None, monotonic=clock)
        self._stopping = False
        self._busy_since: float | None = None
        self.requested = self.classified = self.dropped = self.failed = 0
        self.busy_s = 0.0

    # -- the version's classifier --------------------------------------------------------------

    def serve(self, loaded: LoadedClassifier | None) -> None:
        """Classify with `loaded` from now on (None: the version has no second stage). The
        previous classifier is closed once no classification uses it; waiting requests and
        answers of the previous one are dropped (its labels may differ)."""
        with self._model_lock:
            with self._cond:
                previous, self._loaded = self._loaded, loaded
                self._queue.clear()
                self._answers.clear()
                self._schedule = ClassifySchedule(loaded.stage.every_s) if loaded is not None else None
                self._for = frozenset(loaded.stage.for_labels) if loaded is not None else frozenset()
            if previous is not None and previous is not loaded:
                previous.close()

    @property
    def active(self) -> bool:
        """Whether a classifier is being served."""
        return self._loaded is not None

    # -- the cameras' side (inference threads; never waits for a classification) ---------------

    def offer(self, camera: str, track_id: int, label: str, image: npt.NDArray[np.uint8], box: Sequence[float]) -> bool:
        """A tracked object of `camera` seen in `image` (the frame, BGR) at xyxy `box` (frame
        pixels) with detector `label` (the track's): its crop is queued when the stage serves a
        classifier for that label and the object is due (`ClassifySchedule`). A track whose
        label is not one the classifier is for has no class (one it had is dropped: its label
        changed). Returns whether it was queued."""
        with self._cond:
            schedule = self._schedule
            if schedule is None:
                return False
            key = (camera, track_id)
            if self._for and label not in self._for:
                # not (or no longer: its best detection now says another label) an object the
                # classifier is for: no class, and an answer still on its way is discarded
                schedule.forget(key)
                self._answers.pop(key, None)
                return False
            if not schedule.due(key, self._clock()):
                return False
            crop = crop_box(image, box)
            if crop.size == 0:
                return False
            if len(self._queue) >= self.capacity:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(Request(key, crop, self._clock()))
            self.requested += 1
            self._cond.notify()
            return True

    def result(self, camera: str, track_id: int) -> ObjectClass | None:
        """The object's latest answer (None: none yet, or no classifier)."""
        with self._cond:
            return self._answers.get((camera, track_id))

    def forget(self, camera: str, track_id: int) -> None:
        """The object's track ended: its schedule entry and answer are dropped."""
        with self._cond:
            if self._schedule is not None:
                self._schedule.forget((camera, track_id))
            self._answers.pop((camera, track_id), None)

    def waiting(self) -> list[Key]:
        """The keys of the requests in the queue, oldest first (any thread)."""
        with self._cond:
            return [request.key for request in self._queue]

    def held(self) -> int:
        """Per-object entries held (schedule and answers): 0 once every track ended."""
        with self._cond:
            return len(self._answers) + (len(self._schedule) if self._schedule is not None else 0)

    def counts(self) -> StageCounts:
        with self._cond:
            return StageCounts(self.requested, self.classified, self.dropped, self.failed, self.busy_s)

    # -- the classify thread --------------------------------------------------------------------

    def step(self, wait: bool = False) -> bool:
        """Classify the oldest waiting crop (with `wait`, wait for one or for `stop`); returns
        whether one was classified. The thread's loop; a test may call it directly."""
        with self._cond:
            while wait and not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return False
            request = self._queue.popleft()
        with self._model_lock:
            loaded = self._loaded
            if loaded is None:
                return False
            started = self._clock()
            self._busy_since = started
            try:
                scores = loaded.classifier.classify(request.crop)
            except Exception:
                log.exception("the classifier failed on a crop of %s track %d", *request.key)
                with self._cond:
                    self.failed += 1
                return False
            finally:
                self._busy_since = None
            [(class_id, score)] = scores.top(1)
            labels = loaded.stage.labels
            label = labels[class_id] if 0 <= class_id < len(labels) else str(class_id)
            answer = ObjectClass(label, class_id, score, request.asked)
            with self._cond:
                self.busy_s += self._clock() - started
                self.classified += 1
                if self._loaded is loaded and self._schedule is not None and request.key in self._schedule:
                    self._answers[request.key] = answer  # not for a track that ended meanwhile
        return True

    def start(self) -> None:
        """Start the ``classify`` thread (once)."""
        if self._worker.alive:
            return
        self._stopping = False
        self._worker.start()

    def _turn(self) -> float:
        self.step(wait=True)
        return 0.0

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread and close the classifier (requests still waiting are dropped)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._worker.stop(timeout)
        self.serve(None)

    def loop(self) -> LoopState:
        """For `health()`: how long the classification in progress has taken past none (an idle
        thread waits for work, on time), whether its turns fail, or why the thread ended (any
        thread)."""
        state = self._worker.state()
        since = self._busy_since
        if since is None or not self._worker.alive:
            return state
        return dataclasses.replace(state, stalled_s=max(0.0, self._clock() - since))
