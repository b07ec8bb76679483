"""Building a version's TensorRT engine in the background while something else serves.

`EngineBuilder.request` starts a build in its own thread (``engine-build``) and returns at
once; a request for another version cancels the build in progress (TensorRT stops at its next
step). When a build ends, `on_done` is called from the build thread with the version folder and
the final `EngineStatus`; the cameras then swap to the engine, or fall back to ONNX Runtime with
the reason. `status` is the current (or last) build as a frozen value for the agent snapshot.

Thread safety: every method may be called from any thread; `on_done` is called without the
builder's lock held.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from agent.bundles.engine_settings import bundle_calibration, prebuilt_engines, version_settings
from agent.bundles.manifest import Manifest
from agent.errors import ErrorCode
from agent.snapshot import BuildState, EngineStatus
from pipelines.worker import Worker
from runtimes.base import BackendError
from runtimes.registry import RuntimeSettings
from runtimes.tensorrt_backend import TensorRTConfig
from runtimes.tensorrt_build import BuildCancelled, BuildProgress
from runtimes.tensorrt_engines import prepare_engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Job:
    version: Path
    artifact: Path
    cancel: threading.Event


class EngineBuilder:
    """One build at a time (a Jetson has one GPU and little memory to spare)."""

    def __init__(
        self,
        on_done: Callable[[Path, EngineStatus], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._on_done, self._clock = on_done, clock
        self._lock = threading.Lock()
        self._job: _Job | None = None
        self._thread: Worker | None = None
        self._status: EngineStatus | None = None

    def status(self) -> EngineStatus | None:
        with self._lock:
            return self._status

    def note(self, text: str) -> None:
        """Say what serves while the build runs (shown with the status)."""
        with self._lock:
            if self._status is not None:
                self._status = replace(self._status, note=text)

    def building(self, version: Path) -> bool:
        with self._lock:
            return self._job is not None and self._job.version == version and self._status is not None

    def request(
        self, version: Path, manifest: Manifest, artifact: Path, sha256: str, settings: RuntimeSettings
    ) -> None:
        """Build the engine of `artifact` (an ONNX file of the installed `version`) with the
        TensorRT settings of `settings` for this version (its manifest's profile) unless that
        build is already running; cancels a build for another version."""
        config = version_settings(settings, manifest).of(TensorRTConfig)
        with self._lock:
            if self._job is not None and self._job.version == version and self._job.artifact == artifact:
                return
            if self._job is not None:
                self._job.cancel.set()
            job = _Job(version, artifact, threading.Event())
            self._job = job
            self._status = EngineStatus(
                bundle=f"{manifest.name} {manifest.version}",
                artifact=artifact.name,
                precision=config.precision,
                state="building",
                phase=None,
                progress=0.0,
                started=self._clock(),
            )
            build = functools.partial(self._build, job, manifest, sha256, config)
            thread = Worker.once("engine-build", build, described="the TensorRT engine build", logger=log)
            self._thread = thread
        thread.start()

    def _progress(self, job: _Job, progress: BuildProgress) -> None:
        with self._lock:
            if self._job is job and self._status is not None:
                self._status = replace(self._status, phase=progress.phase, progress=progress.fraction)

    def _build(self, job: _Job, manifest: Manifest, sha256: str, config: TensorRTConfig) -> None:
        state: BuildState = "ready"
        code = message = None
        try:
            prepared = prepare_engine(
                job.artifact,
                config,
                sha256=sha256,
                calibration=bundle_calibration(job.version, manifest),
                prebuilt=prebuilt_engines(job.version, manifest),
                on_progress=lambda progress: self._progress(job, progress),
                cancel=job.cancel,
            )
            message = f"engine {prepared.how}: {prepared.key.describe()}"
        except BuildCancelled as exc:
            state, message = "cancelled", str(exc)
        except (BackendError, OSError) as exc:
            state, code, message = "failed", ErrorCode.ENGINE_BUILD_FAILED.value, str(exc)
            log.error("tensorrt engine for %s failed: %s; ONNX Runtime serves instead", job.artifact.name, exc)
        with self._lock:
            if self._job is not job or self._status is None:
                return  # superseded by a newer request
            done = 1.0 if state == "ready" else self._status.progress
            status = replace(
                self._status, state=state, progress=done, finished=self._clock(), error_code=code, message=message
            )
            self._status, self._job = status, None
        if state != "cancelled":
            self._on_done(job.version, status)

    def fail(self, code: ErrorCode, message: str) -> None:
        """Mark the last build failed after the fact (its engine failed the parity check)."""
        with self._lock:
            if self._status is not None:
                self._status = replace(self._status, state="failed", error_code=code.value, message=message)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel a build in progress and wait for its thread (TensorRT stops at its next step)."""
        with self._lock:
            if self._job is not None:
                self._job.cancel.set()
            thread = self._thread
        if thread is not None:
            thread.stop(timeout, finish=True)  # from its own thread (its `on_done`): no wait
