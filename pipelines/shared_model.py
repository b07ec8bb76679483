"""One loaded model serving several cameras, with batched inference across them.

`SharedModel` holds one `Detector` (one runtime: one ONNX Runtime session, one LiteRT model)
and serves every camera that `attach`es to it. Each camera's pipeline gets a `CameraModel`, the
`FrameDetector` a pipeline uses: preprocessing and decoding stay in the camera's own inference
threads; `infer` hands the tensor to the model's serving threads and waits for its outputs. A
waiting tensor is `Detector.compact` (uint8 pixels, a quarter of a float input's bytes); the
serving thread normalises it, a batch at once.
Each hold keeps detections by its camera's own `DetectionFilter` (conf, iou, max_det, classes),
applied to that camera's outputs after the shared (batched) inference.

Serving threads (``serve-<model>-<n>``, `workers` of them) each own a runtime for their calls
(`Runtime.for_worker`: the one session for ONNX Runtime, an interpreter per thread for LiteRT,
an execution context per thread for TensorRT). When the model's input and outputs have a
dynamic batch axis, a serving thread takes the oldest waiting frame, then waits up to
`BatchPolicy.max_wait_s` for frames from the other attached cameras (at most one frame per
camera, the same tensor shape, `max_batch` in all), runs them as one batch and hands each camera
its own slice of the outputs. Otherwise frames run one at a time, oldest first.

Lifetime: `attach` counts a user, `CameraModel.close` (once per camera) uncounts it; the last
close stops the serving threads and closes the runtimes. A pipeline closes the `CameraModel` it
swapped out once no frame in flight uses it, so a hot swap replaces the model of every camera
between frames and the old one is closed when its last camera let go.

Thread safety: `infer`, `attach` and `stats` from any thread; one condition guards the queue.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detection_filter import DetectionFilter
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.decoding.preprocess import Transform
from pipelines.worker import DONE, Worker
from runtimes.base import InferenceError, Runtime

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchPolicy:
    """Whether frames of several cameras are inferred together: `enabled` (only on a model with a
    dynamic batch axis), `max_wait_s` (how long the first frame waits for the others) and
    `max_batch` (the most frames in one batch)."""

    enabled: bool = True
    max_wait_s: float = 0.01
    max_batch: int = 8


@dataclass(frozen=True)
class SharedModelStats:
    """`cameras` attached now; `batches` run and `frames` inferred since it was loaded."""

    cameras: int
    batches: int
    frames: int
    batching: bool

    @property
    def mean_batch(self) -> float:
        return round(self.frames / self.batches, 2) if self.batches else 0.0


@dataclass
class Request:
    """One camera's frame waiting for the model; `done` is set once `outputs` or `error` is."""

    camera: str
    tensor: npt.NDArray[Any]
    done: threading.Event = field(default_factory=threading.Event)
    outputs: list[npt.NDArray[Any]] | None = None
    error: BaseException | None = None


def batch_axis(runtime: Runtime) -> str | None:
    """Why `runtime`'s model cannot batch frames, or None when it can (a dynamic first axis on its
    one input and every output)."""
    if len(runtime.inputs) != 1 or runtime.inputs[0].shape[:1] != (None,):
        return "its input has a fixed batch size"
    fixed = [spec.name for spec in runtime.outputs if spec.shape[:1] != (None,)]
    return f"output {fixed[0]!r} has a fixed batch size" if fixed else None


def gather(batch: list[Request], pending: list[Request], max_batch: int) -> None:
    """Move the waiting frames that may join `batch` from `pending` into it, oldest first: at
    most one per camera, the same tensor shape and dtype as the batch's first (a `compact` uint8
    tensor and a float one do not mix), `max_batch` in all."""
    cameras = {r.camera for r in batch}
    first = batch[0].tensor
    for request in list(pending):
        if len(batch) >= max_batch:
            return
        tensor = request.tensor
        if request.camera not in cameras and tensor.shape == first.shape and tensor.dtype == first.dtype:
            batch.append(request)
            cameras.add(request.camera)
            pending.remove(request)


class SharedModel:
    """`detector`'s model serving every attached camera (see the module docstring)."""

    def __init__(
        self,
        detector: Detector,
        *,
        workers: int = 1,
        policy: BatchPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if workers < 1:
            raise ValueError(f"a shared model needs at least 1 serving thread, got {workers}")
        self.detector, self.runtime = detector, detector.runtime
        self.policy = policy or BatchPolicy()
        why_not = batch_axis(self.runtime)
        self.batching = self.policy.enabled and self.policy.max_batch > 1 and why_not is None
        if self.policy.enabled and why_not is not None:
            log.info("%s: frames run one at a time: %s", self.runtime.model_path.name, why_not)
        self._clock = clock
        self._cond = threading.Condition()
        self._pending: list[Request] = []
        self._users: dict[str, int] = {}
        self._closed = False
        self._batches = self._frames = 0
        self._runtimes = [self.runtime]
        try:
            self._runtimes += [self.runtime.for_worker() for _ in range(workers - 1)]
        except Exception:
            for runtime in self._runtimes[1:]:
                runtime.close()
            raise
        name = self.runtime.model_path.stem
        self._threads = [
            Worker(
                f"serve-{name}-{i}",
                functools.partial(self._serve, runtime),
                described=f"{name}'s server",
                budget_s=None,
            )
            for i, runtime in enumerate(self._runtimes)
        ]
        for thread in self._threads:
            thread.start()

    # -- users --------------------------------------------------------------------------------

    def attach(self, camera: str, detection_filter: DetectionFilter | None = None) -> CameraModel:
        """A hold on this model for `camera`'s pipeline, keeping detections by `detection_filter`
        (default: the model's own); `CameraModel.close` releases it."""
        with self._cond:
            if self._closed:
                raise InferenceError(f"{self.runtime.model_path.name} was closed")
            self._users[camera] = self._users.get(camera, 0) + 1
        return CameraModel(self, camera, detection_filter or self.detector.detection_filter)

    def _release(self, camera: str) -> None:
        with self._cond:
            self._users[camera] -= 1
            if self._users[camera] == 0:
                del self._users[camera]
            last = not self._users
        if last:
            self.close()

    def close(self) -> None:
        """Stop serving (frames still waiting fail) and close the runtimes; idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            waiting, self._pending = self._pending, []
            self._cond.notify_all()
        for request in waiting:
            request.error = InferenceError(f"{self.runtime.model_path.name} was closed")
            request.done.set()
        for thread in self._threads:
            thread.stop(10.0, finish=True)  # from its own thread (a last user released there): no wait
        for runtime in {id(r): r for r in reversed(self._runtimes)}.values():
            runtime.close()  # the per-thread runtimes first, the model's own last
        log.info("closed the shared model %s", self.runtime.model_path.name)

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> SharedModelStats:
        with self._cond:
            return SharedModelStats(len(self._users), self._batches, self._frames, self.batching)

    # -- inference ----------------------------------------------------------------------------

    def infer(self, camera: str, tensor: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        """`camera`'s frame through the model (in a batch when it can); blocks until its
        outputs are back, dequantized, batch axis 1. Raises `InferenceError` as `Runtime.infer`."""
        request = Request(camera, tensor)
        with self._cond:
            if self._closed:
                raise InferenceError(f"{self.runtime.model_path.name} was closed")
            self._pending.append(request)
            self._cond.notify_all()
        request.done.wait()
        if request.error is not None:
            raise request.error
        assert request.outputs is not None
        return request.outputs

    def _take(self) -> list[Request]:
        """The next batch (one frame when not batching); empty once closed."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return []
            batch = [self._pending.pop(0)]
            if not self.batching:
                return batch
            deadline = self._clock() + self.policy.max_wait_s
            while True:
                gather(batch, self._pending, self.policy.max_batch)
                wanted = min(self.policy.max_batch, max(len(self._users), 1))
                remaining = deadline - self._clock()
                if len(batch) >= wanted or remaining <= 0 or self._closed:
                    return batch
                self._cond.wait(remaining)

    def _serve(self, runtime: Runtime) -> float | None:
        """A serving worker's turn: the next batch on `runtime` (`DONE` once closed)."""
        batch = self._take()
        if not batch:
            return DONE
        try:
            tensor = batch[0].tensor if len(batch) == 1 else np.concatenate([r.tensor for r in batch])
            outputs = self.detector.infer(tensor, runtime)
            for i, request in enumerate(batch):
                request.outputs = outputs if len(batch) == 1 else [o[i : i + 1] for o in outputs]
        except Exception as exc:  # every camera of the batch gets the failure as its own
            for request in batch:
                request.error = exc
        finally:
            with self._cond:
                self._batches += 1
                self._frames += len(batch)
            for request in batch:
                request.done.set()
        return 0.0


class CameraModel:
    """One camera's hold on a `SharedModel`: the `FrameDetector` its pipeline uses, keeping the
    camera's detections by its `detection_filter`."""

    def __init__(self, shared: SharedModel, camera: str, detection_filter: DetectionFilter) -> None:
        self.shared, self.camera, self.detection_filter = shared, camera, detection_filter
        self._released = False
        self._lock = threading.Lock()

    @property
    def runtime(self) -> Runtime:
        return self.shared.runtime

    def prepare(self, frame: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], Transform]:
        return self.shared.detector.compact(frame)

    def infer(self, tensor: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        return self.shared.infer(self.camera, tensor)

    def postprocess(self, outputs: list[npt.NDArray[Any]], transform: Transform) -> Detections:
        return self.shared.detector.postprocess(outputs, transform, self.detection_filter)

    def close(self) -> None:
        """Release this camera's hold (once; later calls do nothing)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self.shared._release(self.camera)
