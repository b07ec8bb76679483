"""What a running device does on request: serve its current version, roll back, restart a
camera, hand out a camera's annotated frame.

`DeviceActions` is shared by the MQTT commands (`commands()` makes their
`agent.mqtt.commands.CommandActions`) and the status page (`controls()` makes its
`agent.web.controls.AgentControls`), so both do the same thing and neither reaches into the
agent. The actions raise `agent.errors.CodedError` with ``NO_PREVIOUS``, ``BUSY``,
``NO_PIPELINE`` or ``NO_FRAME``.

Threads: the actions run on the commands thread and the page's worker threads; `serve_current`
also on the main thread (start) and the deployer's (after a deployment). A rollback goes
through the deployer when there is one (serialised with deployments); without a broker there
is none, and rollbacks take `_rollback_lock`, one at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from agent.bundles.installer import rollback
from agent.bundles.record import Deployment
from agent.bundles.store import Store
from agent.deployment.deployer import Deployer, deployment_status
from agent.errors import BundleError, CodedError, ErrorCode
from agent.event_values import Event
from agent.mqtt.commands import CommandActions, shorten
from agent.serving.cameras import Cameras
from agent.snapshot import AgentSnapshot, Health
from agent.web.controls import AgentControls
from pipelines.annotate import encode_jpeg
from pipelines.health_watch import HealthWatch

log = logging.getLogger(__name__)


class DeviceActions:
    """The actions on `cameras` and `store`; `deployer()` is the running deployer (None without
    a broker, or before the agent started). `serving_error` says why the current version cannot
    be served (None: it serves, or nothing is installed)."""

    def __init__(self, store: Store, cameras: Cameras, deployer: Callable[[], Deployer | None]) -> None:
        self.store, self.cameras, self._deployer = store, cameras, deployer
        self.serving_error: str | None = None
        self._rollback_lock = threading.Lock()

    def serve_current(self) -> None:
        """Serve the store's current version on the cameras (none: stop them), with the tuning
        autotune chose for it; a version that cannot be served is logged and kept in
        `serving_error`."""
        sha = self.store.current_sha()
        if sha is None:
            self.cameras.stop()  # a rollback of the first version: nothing to serve
            return
        if not self.cameras.sections:
            return
        try:
            self.cameras.activate(self.store.versions / sha, self.store.tuning(sha))
            self.serving_error = None
        except BundleError as exc:
            self.serving_error = str(exc)
            log.error("cannot serve the current version %s: %s", sha[:12], exc)

    def rollback(self) -> Deployment:
        """Return to the previous version and serve it: through the deployer when there is one
        (serialised with deployments; a download is cancelled, a probation ends), else on the
        store directly. Raises `CodedError`: ``NO_PREVIOUS``, or ``BUSY`` when a deployment
        step does not end in time."""
        try:
            deployer = self._deployer()
            if deployer is not None:
                return deployer.request_rollback()
            with self._rollback_lock:
                deployment = rollback(self.store)
                self.serve_current()
                return deployment
        except LookupError as exc:
            raise CodedError(ErrorCode.NO_PREVIOUS, str(exc)) from exc
        except TimeoutError as exc:
            raise CodedError(ErrorCode.BUSY, str(exc)) from exc

    def restart_camera(self, name: str | None) -> list[str]:
        """Restart one camera's pipeline (None: all) with a fresh source; the names restarted.
        Raises `CodedError` ``NO_PIPELINE``."""
        try:
            return self.cameras.restart(name)
        except KeyError as exc:
            raise CodedError(ErrorCode.NO_PIPELINE, shorten(str(exc.args[0]), 300)) from exc

    def camera_jpeg(self, name: str | None, quality: int = 85) -> bytes:
        """The camera's newest frame with its detections drawn (None: the first camera), as
        JPEG. Raises `CodedError` ``NO_PIPELINE`` or ``NO_FRAME``."""
        try:
            pipeline = self.cameras.get(name)
        except KeyError as exc:
            raise CodedError(ErrorCode.NO_PIPELINE, shorten(str(exc.args[0]), 300)) from exc
        jpeg = pipeline.snapshot(quality)
        if jpeg is None:
            raise CodedError(ErrorCode.NO_FRAME, f"camera {pipeline.name} has not processed a frame yet")
        return jpeg

    def _health_watch(self, name: str) -> HealthWatch:
        try:
            return self.cameras.health_watch(name)
        except KeyError as exc:
            raise CodedError(ErrorCode.NO_PIPELINE, shorten(str(exc.args[0]), 300)) from exc

    def camera_reference(self, name: str) -> bytes:
        """The camera's health reference image (the check's grey copy) as JPEG. Raises
        `CodedError` ``NO_PIPELINE`` (no such camera, or its check is off) or ``NO_FRAME``."""
        reference = self._health_watch(name).reference
        if reference is None:
            raise CodedError(
                ErrorCode.NO_FRAME, f"camera {name} has no reference image yet (kept once it has been good a while)"
            )
        return encode_jpeg(reference, 90)

    def accept_view(self, name: str) -> None:
        """The camera's next frame judged becomes its health reference (its new normal view):
        "moved" clears. Raises `CodedError` ``NO_PIPELINE``."""
        self._health_watch(name).reset_reference()
        log.warning("camera %s: its next frame becomes its reference image (a new view accepted)", name)

    def commands(self, state: Callable[[], str], clock: Callable[[], float]) -> CommandActions:
        """The actions as the MQTT commands take them (`state()`: the agent's lifecycle state)."""
        return CommandActions(
            state, self.rollback, self.restart_camera, self.camera_jpeg, clock, accept_view=self.accept_view
        )

    def controls(
        self, snapshot: Callable[[], AgentSnapshot], health: Callable[[], Health], events: Callable[[], list[Event]]
    ) -> AgentControls:
        """The actions as the status page takes them, with what it reads."""
        return AgentControls(
            snapshot=snapshot,
            health=health,
            rollback=lambda: deployment_status(self.rollback()),
            restart=self.restart_camera,
            camera_jpeg=self.camera_jpeg,
            events=events,
            camera_reference=self.camera_reference,
            accept_view=self.accept_view,
        )
