"""The device side of fleet deployments: follow ``desired``, download, install, report.

The device listens to its own ``desired`` topic and its group's; a device document overrides
the group's (an empty retained message clears it). Each desired document has an id and the
device acts on each id once (``followed.json``), so a rollback is not undone by the retained
document it rolled back from. A deployment runs in this class's worker thread::

    QUEUED -> DOWNLOADING (chunks, resumable) -> VERIFYING -> INSTALLING -> ACTIVATING
           -> SUCCEEDED | REJECTED (code) | FAILED -> ROLLED_BACK

The ``deployment`` topic (retained) carries the record with progress and error codes.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from agent.bundles.install import InstallPolicy, install
from agent.bundles.store import FINAL_STATES, Deployment, State, Store
from agent.config.models import AgentConfig
from agent.daemon.transfer import Cancelled, PartialBundle, fetch_over_http, fetch_over_mqtt
from agent.errors import BundleError, ErrorCode
from agent.hardware.probe import Board
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import ChunkIndex, Desired, ProtocolError, Topics, json_payload
from agent.snapshot import DeploymentStatus, DownloadProgress

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 0.5


def deployment_document(deployment: Deployment, progress: DownloadProgress | None = None) -> dict[str, Any]:
    """The retained ``deployment`` document (docs/mqtt.md)."""
    document = asdict(deployment)
    document["history"] = [{"state": s, "ts": t} for s, t in deployment.history]
    if progress is not None:
        document["progress"] = asdict(progress)
    return document


def deployment_status(deployment: Deployment, progress: DownloadProgress | None = None) -> DeploymentStatus:
    """The record as the agent snapshot shows it."""
    error = deployment.error or {}
    return DeploymentStatus(
        id=deployment.id,
        name=deployment.name,
        version=deployment.version,
        sha256=deployment.sha256,
        state=deployment.state,
        error_code=error.get("code"),
        error_message=error.get("message"),
        attempt=deployment.attempt,
        progress=progress,
    )


class Deployer:
    """Follows the desired documents of one device; `on_succeeded` is called (in the worker
    thread) after a new version became current, to swap it into the cameras."""

    def __init__(
        self,
        config: AgentConfig,
        device: str,
        store: Store,
        board: Board,
        link: MqttLink,
        topics: Topics,
        policy: InstallPolicy,
        on_succeeded: Callable[[Deployment], None],
    ) -> None:
        self.config, self.device, self.store, self.board = config, device, store, board
        self.link, self.topics, self.policy = link, topics, policy
        self._on_succeeded = on_succeeded
        self._lock = threading.Condition()
        self._device_doc: Desired | None = None
        self._group_doc: Desired | None = None
        self._index: dict[str, ChunkIndex] = {}
        self._working_on: str | None = None
        self.install_lock = threading.Lock()  # held while a deployment changes the store
        self._progress: DownloadProgress | None = None  # of the download in this deployment
        self.latest: DeploymentStatus | None = None  # the record last published
        self._stop = threading.Event()
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self.problem: str | None = None  # the last desired or index document that was refused

    # -- wiring --------------------------------------------------------------------------------

    def start(self) -> Deployer:
        filters = [self.topics.desired(self.device)]
        if self.config.device.group:
            filters.append(self.topics.group_desired(self.config.device.group))
        self.link.subscribe_many(filters, self._on_desired)  # device first: its retained copy arrives first
        self._thread = threading.Thread(target=self._work, name="deployer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current step; a download in progress is kept and resumes next time."""
        self._stop.set()
        self._cancel.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def busy(self) -> bool:
        return self._working_on is not None

    def wanted(self) -> Desired | None:
        return self._device_doc if self._device_doc is not None else self._group_doc

    def _parse(self, kind: type[Desired] | type[ChunkIndex], message: Message) -> Any:
        """The document in `message`, or None (logged, kept in `problem`) when it is malformed."""
        try:
            return kind.parse(message.payload, message.topic)
        except ProtocolError as exc:
            self.problem = str(exc)
            log.error("deployment: %s; ignored", exc)
            return None

    def _on_desired(self, message: Message) -> None:
        document: Desired | None = None
        if message.payload:  # an empty retained message clears the document
            document = self._parse(Desired, message)
            if document is None:
                return
        with self._lock:
            if message.topic == self.topics.desired(self.device):
                self._device_doc = document
            else:
                self._group_doc = document
            wanted = self.wanted()
            if self._working_on is not None and (wanted is None or wanted.id != self._working_on):
                self._cancel.set()  # a newer document replaces the one being downloaded
            self._lock.notify_all()

    def _on_index(self, message: Message) -> None:
        index = self._parse(ChunkIndex, message) if message.payload else None
        if index is not None:
            with self._lock:
                self._index[message.topic] = index
                self._lock.notify_all()

    # -- the worker ----------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                desired = self.wanted()
                while not self._stop.is_set() and (desired is None or desired.id == self.store.followed()):
                    self._lock.wait(1.0)
                    desired = self.wanted()
                if self._stop.is_set() or desired is None:
                    return
                self._working_on = desired.id
                self._cancel.clear()
            try:
                with self.install_lock:
                    self._deploy(desired)
            except Cancelled:
                log.info("deployment %s paused; it resumes from the chunks on disk", desired.id)
            except Exception:
                log.exception("deployment %s: unexpected failure", desired.id)
                self._stop.wait(5.0)  # do not spin on a bug; the record says where it stopped
            finally:
                with self._lock:
                    self._working_on = None

    def _publish(self, deployment: Deployment, progress: DownloadProgress | None = None) -> None:
        """Publish the record; the download's last progress stays in it through the later states."""
        if progress is not None:
            self._progress = progress
        self.latest = deployment_status(deployment, self._progress)
        document = deployment_document(deployment, self._progress)
        self.link.publish_state(self.topics.deployment(self.device), json_payload(document))

    def report(self, deployment: Deployment) -> None:
        """Publish a record made outside a download (a rollback), with no progress."""
        self._progress = None
        self._publish(deployment)

    def _step(self, deployment: Deployment, state: State, error: BundleError | None = None) -> None:
        """Move the record to `state`, write it (atomically) and publish it."""
        deployment.to(state, error)
        self.store.record(deployment)
        self._publish(deployment)

    def _finish(self, deployment: Deployment, desired: Desired) -> None:
        self.store.follow(desired.id)
        if deployment.state == State.SUCCEEDED:
            self._on_succeeded(deployment)

    def _deploy(self, desired: Desired) -> None:
        store = self.store
        self._progress = None
        last = store.last_deployment()
        same = last if last is not None and last.id == desired.id else None
        if same is not None and same.state in FINAL_STATES and not self._retry_after_crash(same):
            self._publish(same)
            self._finish(same, desired)
            return
        if same is not None and same.state not in FINAL_STATES:
            deployment = same  # resume after a restart: same record, same history
        else:
            deployment = Deployment(
                id=desired.id,
                sha256=desired.sha256,
                name=desired.name,
                version=desired.version,
                from_sha=store.current_sha(),
                previous_before=store.previous_sha(),
                attempt=same.attempt + 1 if same is not None else 1,
            )
        if desired.sha256 == store.current_sha():
            self._step(deployment, State.SUCCEEDED)
            store.follow(desired.id)
            log.info("deployment %s: %s %s is already running", desired.id, desired.name, desired.version)
            return
        if deployment.state != State.DOWNLOADING:
            self._step(deployment, State.QUEUED)
        try:
            index = self._wait_index(desired)
            bundle = self._download(desired, index, deployment)
        except BundleError as exc:
            self._step(deployment, State.REJECTED, exc)
            log.error("deployment %s rejected: %s", desired.id, exc)
            self._finish(deployment, desired)
            return
        result = install(
            bundle.path,
            store,
            self.board,
            self.policy,
            on_state=self._publish,
            deployment=deployment,
            sha256_checked=True,  # PartialBundle.finish hashed it
        )
        bundle.remove()
        self._finish(result, desired)

    @staticmethod
    def _retry_after_crash(last: Deployment) -> bool:
        """A deployment that ended without being followed was cut short by a crash (the record
        is final, `followed.json` not written yet). Retry it once if the crash came while
        verifying or installing (a power cut); never after a crash while activating, where the
        new model itself may be what took the process down (retrying could loop forever)."""
        interrupted = (last.error or {}).get("code") == ErrorCode.INTERRUPTED
        return interrupted and last.state == State.REJECTED and last.attempt < 2

    def _wait_index(self, desired: Desired) -> ChunkIndex:
        topic = self.topics.index(desired.sha256)
        self.link.subscribe(topic, self._on_index)
        warn_at = time.monotonic() + self.config.deployments.stall_timeout_s
        try:
            with self._lock:
                while topic not in self._index:
                    if self._cancel.is_set():
                        raise Cancelled()
                    self._lock.wait(0.5)
                    if time.monotonic() > warn_at:
                        warn_at = float("inf")
                        self.problem = f"no chunk index {topic} on the broker (removed by fleet gc?); still waiting"
                        log.warning("deployment %s: %s", desired.id, self.problem)
                index = self._index.pop(topic)
        finally:
            self.link.unsubscribe(topic)
        announced = (desired.sha256, desired.size, desired.chunk_size, desired.chunks)
        if (index.sha256, index.size, index.chunk_size, len(index.chunks)) != announced:
            raise BundleError(
                ErrorCode.INDEX_MISMATCH,
                f"the chunk index of {desired.sha256[:12]} does not match the desired document "
                "(sha256, size, chunk size or count differ); push the bundle again",
            )
        return index

    def _download(self, desired: Desired, index: ChunkIndex, deployment: Deployment) -> PartialBundle:
        partial = PartialBundle(self.store.downloads / desired.sha256, index).open()
        self._clean_other_downloads(keep=desired.sha256)
        deployment.to(State.DOWNLOADING)
        self.store.record(deployment)
        last = 0.0

        def progress(done: int, total: int) -> None:
            nonlocal last
            now = time.monotonic()
            if done == total or now - last >= PROGRESS_EVERY_S:
                last = now
                self._publish(
                    deployment,
                    DownloadProgress(
                        chunks_done=done,
                        chunks_total=total,
                        bytes_done=min(done * index.chunk_size, index.size),
                        bytes_total=index.size,
                        resumed=partial.resumed,
                        fetched=partial.written,
                        duplicates=partial.duplicates,
                    ),
                )

        progress(len(partial.done), len(index.chunks))
        settings = self.config.deployments
        try:
            if desired.source == "url":
                assert desired.url is not None
                fetch_over_http(
                    desired.url,
                    partial,
                    max_rate=settings.max_download_rate,
                    timeout=settings.http_timeout_s,
                    cancel=self._cancel,
                    progress=progress,
                )
            else:
                fetch_over_mqtt(
                    self.link,
                    self.topics,
                    partial,
                    window=settings.window,
                    max_rate=settings.max_download_rate,
                    stall_timeout=settings.stall_timeout_s,
                    cancel=self._cancel,
                    progress=progress,
                )
            partial.finish()
        except BundleError:
            partial.remove()
            raise
        finally:
            partial.close()
        return partial

    def _clean_other_downloads(self, keep: str) -> None:
        """Only one download is kept for resuming: the one the device follows now."""
        for folder in self.store.downloads.iterdir():
            if folder.name != keep:
                shutil.rmtree(folder, ignore_errors=True)
