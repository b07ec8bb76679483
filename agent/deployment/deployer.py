"""The device side of fleet deployments: follow ``desired``, download, install, watch, report.

The device listens to its own ``desired`` topic and its group's (`DesiredDocuments`); a device
document overrides the group's (a signed `Release` hands the device back to its group). Every
document passes the `ControlGate` first (signed by an operator, for this device, fresh), and the
device acts on each id once (``followed.json``), so a rollback is not undone by the retained
document it rolled back from. A group document with a rollout schedule is started when this
device's wave opens and not while the rollout is halted; a halt with ``on_halt: rollback`` ends
the download or probation in progress and undoes a deployment that succeeded
(agent/deployment/wave_plan.py decides). A deployment runs in this class's worker thread, its
record moved only as `agent.bundles.record.TRANSITIONS` allows::

    QUEUED -> DOWNLOADING (chunks, resumable) -> VERIFYING -> INSTALLING -> ACTIVATING
           (-> SHADOW) -> PROBATION -> SUCCEEDED | REJECTED (code) | FAILED (code) | FAILED -> ROLLED_BACK

A shadow (the signed document's ``shadow`` over agent.yaml's ``deployments.shadow``,
`agent.deployment.quality.shadow_plan`) runs between activation's checks and the switch: the
daemon's `open_shadow` loads the candidate beside the serving version, `ShadowJudge` reads its
reports about once a second (the injected clock) and the record is published with the running
numbers every `SHADOW_PROGRESS_S`. It ends REJECTED on a gate that disagrees (or is quiet with
``quiet: fail``: SHADOW_DISAGREES), a device with no camera serving (SHADOW_UNAVAILABLE), a
rollback command (CANCELLED: the rollback is answered with that record, nothing else rolls
back), a halted rollout (ROLLOUT_HALTED) or a newer document (SUPERSEDED), the candidate removed
and the serving version untouched; a stop leaves it SHADOW on disk, which the next start ends
REJECTED (INTERRUPTED, `Store.recover`) and never retries.

Every deployment ends: the download has an overall deadline (``DOWNLOAD_TIMEOUT``), a bundle
over the size cap or the free disk is refused before a byte is written, and a record that
cannot be written is still published. The worker thread is the only one that changes the
store: a rollback command is handed to it (`request_rollback`) and cancels a download or ends a
probation in progress. The ``deployment`` topic (retained) carries the record with progress.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path
from typing import Literal, Protocol

from agent import __version__
from agent.bundles.agent_bundle import bundle_kind
from agent.bundles.archive import Verified, read_manifest
from agent.bundles.installer import InstallPolicy, checkpoint, end_probation, install, rollback
from agent.bundles.record import FINAL_STATES, RESUMABLE_STATES, Deployment, State
from agent.bundles.store import Followed, Store
from agent.config.models import AgentConfig
from agent.deployment import agent_deploy
from agent.deployment.agent_deploy import SWITCHING
from agent.deployment.agent_env import install_update
from agent.deployment.agent_switch import AgentDirs, base_environment, running_environment
from agent.deployment.desired import DesiredDocuments, latest
from agent.deployment.download import BundleDownload
from agent.deployment.probation import PASSED, ProbationJudge, QualityCheck
from agent.deployment.quality import ShadowJudge, ShadowPlan, labelled, passes, shadow_plan
from agent.deployment.transfer import Cancelled, PartialBundle
from agent.deployment.wave_plan import Action, Plan, halted_by_rollout, plan, undo_halted
from agent.errors import BundleError, ErrorCode
from agent.hardware.board import Board
from agent.mqtt.commands import ROLLBACK_WAIT_S
from agent.mqtt.control import ControlGate, ControlRefused, Kind
from agent.mqtt.device_documents import DownloadProgress, bounded_quality, bounded_shadow
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import Desired, ProtocolError, Topics
from agent.snapshot import DeploymentStatus, RolloutPosition
from agent.throttle import ThrottledLog
from pipelines.backoff import Backoff
from pipelines.measure.comparison import AgreementReport
from pipelines.pipeline import PipelineStats
from pipelines.worker import DONE, LoopState, Worker

log = logging.getLogger(__name__)

#: the deployer in `Health`'s words
NAME = "the deployer (signed deployments)"
#: while a shadow runs, the record is published with its numbers this often (clock seconds)
SHADOW_PROGRESS_S = 10.0


class Shadow(Protocol):
    """A candidate running beside the serving version (`agent.serving.shadow.ShadowSession`)."""

    def reports(self) -> Mapping[str, AgreementReport]: ...

    def failures(self) -> Mapping[str, int]: ...

    def close(self) -> None: ...


class OpenShadow(Protocol):
    """Opens a shadow of an installed version folder at a share of the time, the folder the
    candidate or (``reference``) the version the serving one is judged against; raises
    `BundleError` (`agent.serving.cameras.Cameras.shadow`)."""

    def __call__(
        self, version: Path, share: float, loaded_is: Literal["candidate", "reference"] = "candidate"
    ) -> Shadow: ...


class _ShadowStopped(Exception):
    """The agent stops during a shadow: the record stays SHADOW on disk (the next start ends it)."""


class Deployer:
    """Follows the desired documents of one device. `on_switched` is called (in the worker
    thread) whenever the store's current version changed, to serve it on the cameras;
    `on_succeeded` when a deployment that switched ended SUCCEEDED (after its probation, if
    any); `camera_stats` reads the cameras for probation; `open_shadow` runs a candidate
    beside the serving version (None: a shadow asked for ends SHADOW_UNAVAILABLE). `clock` is monotonic seconds,
    `wall_clock` Unix seconds (when a rollout's waves open). `payload` makes the retained
    ``deployment`` document of a record and its progress (the daemon hands it
    `agent.daemon.documents.deployment_payload`, the device's one JSON edge)."""

    def __init__(
        self,
        *,
        config: AgentConfig,
        device: str,
        store: Store,
        board: Board,
        link: MqttLink,
        topics: Topics,
        policy: InstallPolicy,
        gate: ControlGate,
        on_switched: Callable[[Deployment], None],
        payload: Callable[[Deployment, DownloadProgress | None], bytes],
        camera_stats: Callable[[], Sequence[PipelineStats]] = list,
        clock: Callable[[], float] = time.monotonic,
        on_succeeded: Callable[[Deployment], None] = lambda deployment: None,
        wall_clock: Callable[[], float] = time.time,
        on_report: Callable[[Deployment], None] = lambda deployment: None,
        open_shadow: OpenShadow | None = None,
    ) -> None:
        self.config, self.device, self.store, self.board = config, device, store, board
        self.link, self.topics, self.policy, self.gate = link, topics, policy, gate
        self._on_switched, self._camera_stats, self._clock = on_switched, camera_stats, clock
        self._payload = payload
        self._on_succeeded = on_succeeded
        self._wall_clock = wall_clock
        self._throttled = ThrottledLog(log, clock=clock)  # refusals anyone on the broker can cause
        self._on_report = on_report  # every record published (the daemon keeps each new state)
        self._open_shadow = open_shadow
        self.agents = AgentDirs(config.state_dir, base_environment())  # edge-agent's own versions
        self._followed = store.followed()
        self.documents = DesiredDocuments(device, topics, gate, lambda: self._followed)
        self._lock = self.documents.lock
        self._working_on: str | None = None
        self._rollbacks: list[Future[Deployment]] = []
        self._progress: DownloadProgress | None = None  # of the download in this deployment
        self.latest: DeploymentStatus | None = None  # the record last published
        self._worker = Worker(
            "deployer", self._turn, described=NAME, budget_s=None, monotonic=clock, backoff=Backoff(5.0, 300.0)
        )
        self._stop = self._worker.stopping
        self._cancel = threading.Event()
        self._timed_out = threading.Event()
        self._halted = threading.Event()  # the rollout in progress was halted with on_halt rollback
        self.problem: str | None = None  # the last control document refused, or a download waiting
        self.rollout: RolloutPosition | None = None  # this device in its group's staged rollout

    # -- wiring --------------------------------------------------------------------------------

    def start(self) -> Deployer:
        filters = [self.topics.desired(self.device)]
        if self.config.device.group:
            filters.append(self.topics.group_desired(self.config.device.group))
        self.link.subscribe_many(filters, self._on_desired)  # device first: its retained copy arrives first
        self._worker.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop after the current step; a download in progress is kept and resumes next time (a
        probation in progress is rolled back at the next start)."""
        self._stop.set()
        self._cancel.set()
        with self._lock:
            self._lock.notify_all()
        self._worker.stop(timeout)

    def loop(self) -> LoopState:
        """The ``deployer`` thread for `health()` (any thread): whether its turns fail, or why
        it ended. A deployment takes as long as its download and probation: no heartbeat."""
        return self._worker.state()

    @property
    def busy(self) -> bool:
        return self._working_on is not None

    def wanted(self) -> Desired | None:
        return self.documents.wanted()

    # -- desired documents (paho's network thread) ---------------------------------------------

    def _on_desired(self, message: Message) -> None:
        try:
            self.documents.accept(message)
        except (ProtocolError, ControlRefused) as exc:
            text = str(exc) if isinstance(exc, ProtocolError) else f"{exc.code}: {message.topic} refused: {exc.message}"
            self._throttled.error("refused", "deployment: %s", text)
            self.problem = text  # after the log: who sees the problem finds its line (or its count) there
            return
        with self._lock:
            self.problem = None
            wanted = self.wanted()
            if self._working_on is not None and (wanted is None or wanted.id != self._working_on):
                self._cancel.set()  # a newer document replaces the one being downloaded
            elif self._working_on is not None and _halts_with_rollback(wanted):
                self._halted.set()  # the download ends, a probation rolls back
                self._cancel.set()
            self._lock.notify_all()

    # -- rollback (any thread) -----------------------------------------------------------------

    #: how long a rollback command waits for the worker to get to it (a long install step)
    rollback_timeout_s = ROLLBACK_WAIT_S  # the rollback command's budget on the commands thread

    #: how often a shadow in progress is judged (real seconds; its judge reads the injected clock)
    shadow_check_s = 1.0

    def request_rollback(self) -> Deployment:
        """Roll back in the worker thread: a download in progress is cancelled, a probation in
        progress ends rolled back. Raises `LookupError` without a previous version and
        `TimeoutError` when the worker does not get to it within `rollback_timeout_s`."""
        future: Future[Deployment] = Future()
        with self._lock:
            self._rollbacks.append(future)
            self._cancel.set()
            self._lock.notify_all()
        try:
            return future.result(self.rollback_timeout_s)
        except FutureTimeout as exc:
            raise TimeoutError("a deployment step is still running; roll back after it ends") from exc

    def _serve_rollbacks(self) -> None:
        with self._lock:
            requests, self._rollbacks = self._rollbacks, []
        for future in requests:
            try:
                deployment = rollback(self.store)
            except LookupError as exc:
                future.set_exception(exc)
                continue
            self.report(deployment)
            self._on_switched(deployment)
            future.set_result(deployment)

    # -- the worker ----------------------------------------------------------------------------

    def _next(self) -> tuple[Desired, Kind, Plan] | None:
        """Wait for a document to act on, with the topic it came from and what to do with it;
        None when a rollback or a release is to be served first, or the deployer stops."""
        with self._lock:
            while not self._stop.is_set():
                if self._rollbacks or self.documents.release_pending:
                    return None
                self._remember_accepted()
                desired, wait = self.wanted(), 1.0
                if desired is None:
                    self.rollout = None
                else:
                    now = self._wall_clock()
                    last = self.store.last_deployment() if desired.rollout is not None else None
                    job = plan(
                        desired=desired,
                        device=self.device,
                        followed_id=self._followed.id,
                        last=last,
                        current_sha=self.store.current_sha(),
                        now=now,
                    )
                    self.rollout = job.position
                    if job.action in (Action.START, Action.UNDO):
                        self._working_on = desired.id
                        self._cancel.clear()
                        self._timed_out.clear()
                        self._halted.clear()
                        return desired, self.documents.kind_of(desired), job
                    if job.wake_at is not None:
                        wait = min(wait, max(0.01, job.wake_at - now))
                self._lock.wait(wait)
            return None

    def _remember_accepted(self) -> None:
        """Write the issue times of documents accepted since followed.json was last written."""
        newest = self.documents.newest(self._followed)
        if newest != self._followed:
            try:
                self._follow(newest)
            except OSError as exc:  # kept in memory; the deployment that follows reports the disk
                log.warning("deployment: cannot write %s: %s", self.store.root / "followed.json", exc.strerror)

    def _turn(self) -> float:
        """Serve a release and the rollbacks asked for, then the next job; a turn that fails (a
        full disk: the problem says so) is retried by the worker after its backoff (5 s doubling
        to 5 min: no spinning on a bug; the record says where it stopped)."""
        job = self._next()
        name = job[0].id if job else "-"
        try:
            self._record_release()
            self._serve_rollbacks()
            if job is not None and job[2].action == Action.UNDO:
                self._undo(job[0], job[1])
            elif job is not None:
                self._deploy(job[0], job[1])
        except Cancelled:
            log.info("deployment %s paused; it resumes from the chunks on disk", name)
        except OSError as exc:  # the state directory cannot be written (a full disk)
            self.problem = f"{ErrorCode.RECORD_UNWRITABLE}: cannot write to {self.store.root}: {exc.strerror}"
            raise
        finally:
            with self._lock:
                self._working_on = None
        return 0.0

    def _record_release(self) -> None:
        released = self.documents.take_release()
        if released is not None:
            self._follow(self.documents.newest(replace(self._followed, device_issued=released)))

    def _follow(self, followed: Followed) -> None:
        self._followed = followed  # remembered even when the disk refuses it
        self.store.follow(followed)

    def _publish(self, deployment: Deployment, progress: DownloadProgress | None = None) -> None:
        """Publish the record; the download's last progress stays in it through the later states."""
        if progress is not None:
            self._progress = progress
        self.latest = deployment_status(deployment, self._progress)
        self.link.publish_state(self.topics.deployment(self.device), self._payload(deployment, self._progress))
        self._on_report(deployment)

    def report(self, deployment: Deployment) -> None:
        """Publish a record made outside a download (a rollback), with no progress."""
        self._progress = None
        self._publish(deployment)

    def _step(self, deployment: Deployment, state: State, error: BundleError | None = None) -> Deployment:
        """The record moved to `state`, published, then written. A record the disk refuses is
        still published; past a final state that is all (`_finish` remembers it in memory), before
        one the `OSError` ends this attempt, retried with backoff."""
        deployment = deployment.to(state, error)
        self._publish(deployment)
        try:
            self.store.record(deployment)
        except OSError as exc:
            if state not in FINAL_STATES:
                raise
            self.problem = f"{ErrorCode.RECORD_UNWRITABLE}: cannot write the deployment record: {exc.strerror}"
            log.error("deployment %s: %s", deployment.id, self.problem)
        return deployment

    def _finish(self, desired: Desired, kind: Kind) -> None:
        """Remember that `desired` was acted on (it is not acted on again), and its issue time as
        the newest accepted from its topic."""
        if kind == "group":
            self.documents.back_to_group = False
        old, issued = self._followed, desired.issued_at
        if kind == "device":
            self._follow(replace(old, id=desired.id, device_issued=latest(issued, old.device_issued)))
        else:
            self._follow(replace(old, id=desired.id, group_issued=latest(issued, old.group_issued)))

    def _deploy(self, desired: Desired, kind: Kind) -> None:
        store, settings = self.store, self.config.deployments
        self._end_superseded(desired)
        self._progress = None
        last = store.last_deployment()
        same = last if last is not None and last.id == desired.id else None
        again = self._retry_after_crash(same) or halted_by_rollout(same, desired.id) if same else False
        if same is not None and same.kind == "agent" and same.state in SWITCHING:
            self._await_agent(desired, kind, same)  # this process, or the one before it, switched edge-agent
            return
        if same is not None and same.state in FINAL_STATES and not again:
            self._publish(same)
            self._finish(desired, kind)
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
            self._finish(desired, kind)
            log.info("deployment %s: %s %s is already running", desired.id, desired.name, desired.version)
            return
        if deployment.state != State.DOWNLOADING:
            deployment = self._step(deployment, State.QUEUED)
        bundle, deployment = self._download(desired, deployment)
        if bundle is None:
            if deployment.error is None or deployment.error.code != ErrorCode.SUPERSEDED:
                self._finish(desired, kind)  # a superseded one is not followed: a release's downgrade holds
            return
        if _is_agent_bundle(bundle.path):
            try:
                self._deploy_agent(desired, kind, deployment, bundle.path)
            finally:
                bundle.remove()
            return
        shadow = shadow_plan(desired.shadow, settings.shadow)
        if shadow is not None and store.current_sha() is None:
            log.info("deployment %s: no shadow, no version serves here yet to compare with", desired.id)
            shadow = None

        def before_switch(record: Deployment, verified: Verified) -> Deployment:
            assert shadow is not None
            return self._shadow(desired, record, verified, shadow)

        try:
            result = install(
                bundle.path,
                store,
                self.board,
                self.policy,
                on_state=self._publish,
                deployment=deployment,
                sha256_checked=True,  # PartialBundle.finish hashed it
                allow_downgrade=desired.allow_downgrade or (kind == "group" and self.documents.back_to_group),
                probation_s=settings.probation_s,
                before_switch=before_switch if shadow is not None else None,
            )
        except _ShadowStopped:
            log.info("deployment %s: the agent stops during the shadow; the next start ends it", desired.id)
            return
        finally:
            bundle.remove()
        if result.state == State.PROBATION:
            result = self._probation(result, desired)
        elif result.state == State.SUCCEEDED:
            self._on_switched(result)
        if result.state == State.SUCCEEDED:
            self._on_succeeded(result)
        if result.error is None or result.error.code != ErrorCode.SUPERSEDED:
            self._finish(desired, kind)  # a superseded one is not followed (as after a download)

    def _deploy_agent(self, desired: Desired, kind: Kind, deployment: Deployment, bundle: Path) -> None:
        """An agent bundle: verify it, install it beside the running version and switch to it
        as ``edge-agent upgrade`` does (agent/deployment/agent_deploy.py), then wait for the
        switch to end (in this process: until the daemon stops to exec the new version)."""
        record = self._step(replace(deployment, kind="agent", name="edge-agent"), State.VERIFYING)
        staging = self.store.versions / f"{record.sha256}.tmp"  # Store.recover removes it after a crash
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging.mkdir(parents=True)
            manifest, wheels = agent_deploy.verify(bundle, staging, self.policy.limits, self.policy.trusted)
            record = self._step(replace(record, version=manifest.version), State.INSTALLING)
            checkpoint("agent-verified")
            if manifest.version == __version__ and self.agents.current_version() in (None, manifest.version):
                log.info("deployment %s: edge-agent %s is already running", desired.id, manifest.version)
                self._step(self._step(record, State.ACTIVATING), State.SUCCEEDED)
                self._finish(desired, kind)
                return
            back_to_group = kind == "group" and self.documents.back_to_group
            allow_downgrade = agent_deploy.downgrade_allowed(desired, back_to_group)
            install_update(self.agents, wheels, running_environment(), allow_downgrade)
            checkpoint("agent-installed")
        except BundleError as exc:
            self._step(record, State.REJECTED, exc)
            log.error("deployment %s rejected: %s", desired.id, exc)
            self._finish(desired, kind)
            return
        except OSError as exc:
            error = BundleError(ErrorCode.AGENT_UPDATE_INSTALL_FAILED, f"cannot install it: {exc.strerror}")
            self._step(record, State.REJECTED, error)
            self._finish(desired, kind)
            return
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        record = self._step(record, State.ACTIVATING)
        self.agents.switch(manifest.version, on_step=lambda step: checkpoint(f"agent-{step}"), deployment=record.id)
        record = self._step(record, State.PROBATION)
        log.warning(
            "deployment %s: switched to edge-agent %s; the agent restarts into it", desired.id, manifest.version
        )
        self._await_agent(desired, kind, record)

    def _await_agent(self, desired: Desired, kind: Kind, record: Deployment) -> None:
        """Wait for edge-agent's switch to `record.version` to end (the new version confirms,
        or is switched back), then end the deployment so; a stop leaves it to the next process."""
        while (ended := agent_deploy.settle(record, self.agents)) is None:
            with self._lock:
                self._lock.wait(1.0)
            if self._stop.is_set():
                return
        self._publish(ended)
        self.store.record(ended)
        self._finish(desired, kind)
        problem = f" ({ended.error.code}: {ended.error.message})" if ended.error is not None else ""
        log.warning("deployment %s: edge-agent %s %s%s", desired.id, ended.version, ended.state, problem)

    def _undo(self, desired: Desired, kind: Kind) -> None:
        """``on_halt: rollback``: undo the deployment of `desired` this device had taken."""
        record = self.store.last_deployment()
        assert record is not None  # plan() undoes only a recorded deployment
        halted = desired.rollout.halted if desired.rollout is not None else None
        result = undo_halted(self.store, record, halted.reason if halted is not None else "")
        self.report(result)
        if result.state == State.ROLLED_BACK:
            self._on_switched(result)
        self._finish(desired, kind)
        log.warning("deployment %s: %s (the rollout was halted)", desired.id, result.state)

    def _download(self, desired: Desired, deployment: Deployment) -> tuple[PartialBundle | None, Deployment]:
        """The downloaded bundle, or None when the deployment ended here (refused, timed out,
        cancelled by a rollback), with the record as the download left it; `Cancelled` when it
        pauses (stop, or a newer document)."""
        timeout = self.config.deployments.download_timeout_s
        remaining = timeout - (time.time() - (deployment.started or time.time()))
        deadline = Worker("download-deadline", self._time_out, described="the download's deadline", budget_s=None)
        deadline.start(delay_s=max(0.0, remaining))
        download = BundleDownload(
            config=self.config,
            link=self.link,
            topics=self.topics,
            downloads=self.store.downloads,
            cancel=self._cancel,
            report=lambda progress: self._publish(deployment, progress),  # as `downloading` left it
            problem=self._set_problem,
        )

        def downloading() -> None:
            nonlocal deployment
            deployment = self._step(deployment, State.DOWNLOADING)

        try:
            return download.run(desired, downloading), deployment
        except BundleError as exc:
            deployment = self._step(deployment, State.REJECTED, exc)
            log.error("deployment %s rejected: %s", desired.id, exc)
        except Cancelled:
            if self._timed_out.is_set():
                error = BundleError(
                    ErrorCode.DOWNLOAD_TIMEOUT,
                    f"the bundle did not arrive within deployments.download_timeout_s ({timeout:.0f} s): "
                    "is its index and are its chunks on the broker (fleet gc?), or is its URL reachable?",
                )
                deployment = self._step(deployment, State.FAILED, error)
            elif self._rollbacks:
                error = BundleError(ErrorCode.CANCELLED, "cancelled by a rollback command")
                deployment = self._step(deployment, State.REJECTED, error)
            elif self._halted.is_set():
                error = BundleError(ErrorCode.ROLLOUT_HALTED, f"the rollout of {desired.id} was halted")
                deployment = self._step(deployment, State.REJECTED, error)
            elif (successor := self._successor(desired)) is not None:
                error = BundleError(ErrorCode.SUPERSEDED, successor)
                deployment = self._step(deployment, State.REJECTED, error)
                log.info("deployment %s: %s", desired.id, successor)
            else:
                raise  # the agent stops: the download resumes at the next start
        finally:
            deadline.stop(1.0)  # cancelled while it waits; a timeout already taken ended it
        return None, deployment

    def _successor(self, desired: Desired) -> str | None:
        """What replaced `desired` as the document to follow, in words (None: nothing did)."""
        if self._stop.is_set():
            return None
        with self._lock:
            wanted = self.wanted()
        if wanted is None:
            return "superseded: no desired document names this device any more (a release, or a clear)"
        if wanted.id != desired.id:
            return f"superseded by deployment {wanted.id} ({wanted.name} {wanted.version})"
        return None

    def _end_superseded(self, desired: Desired) -> None:
        """A record left QUEUED or DOWNLOADING for another document (the agent stopped during
        its download, and a newer document came meanwhile) ends before `desired` starts."""
        last = self.store.last_deployment()
        if last is not None and last.id != desired.id and last.state in RESUMABLE_STATES:
            message = f"superseded by deployment {desired.id} ({desired.name} {desired.version})"
            self._progress = None
            self._step(last, State.REJECTED, BundleError(ErrorCode.SUPERSEDED, message))
            log.info("deployment %s: %s", last.id, message)

    def _time_out(self) -> float | None:
        """The download deadline passed (its worker's one turn, after its delay): stop the download."""
        self._timed_out.set()
        self._cancel.set()
        return DONE

    def _set_problem(self, problem: str | None) -> None:
        self.problem = problem
        if problem is not None:  # a junk index or a stalled link may say it many times a second
            self._throttled.warning("problem", "deployment: %s", problem)

    def _probation(self, deployment: Deployment, desired: Desired) -> Deployment:
        """Serve the new version and watch it; roll it back if it fails (its quality too, as
        `desired` and agent.yaml ask), the operator rolls back, or (by the next start) the agent
        stops first."""
        settings = self.config.deployments
        quality = QualityCheck.of(desired.quality, settings.quality, self._labels(deployment.sha256))
        before = list(self._camera_stats())
        self._on_switched(deployment)
        checkpoint("probation")
        judge = ProbationJudge(
            before, self._clock(), settings.probation_s, settings.probation_min_fps_ratio, quality=quality
        )
        reference = self._reference(deployment) if quality.min_agreement > 0 else None
        verdict: str | None = None
        try:
            while verdict is None:
                with self._lock:
                    self._lock.wait(1.0)
                    rollback_asked = bool(self._rollbacks)
                if self._stop.is_set():
                    return deployment  # still PROBATION on disk: the next start rolls it back
                if rollback_asked:
                    verdict = "rolled back by a rollback command during probation"
                elif self._halted.is_set():
                    verdict = "rolled back: the rollout was halted during probation"
                else:
                    reports = reference.reports() if reference is not None else None
                    verdict = judge.observe(self._camera_stats(), self._clock(), reports)
        finally:
            if reference is not None:
                reference.close()
        failure = None if verdict == PASSED else verdict
        code = ErrorCode.ROLLOUT_HALTED if self._halted.is_set() and not rollback_asked else judge.code
        if judge.quality is not None:
            deployment = replace(deployment, quality=judge.quality)
        result = end_probation(self.store, deployment, failure, self._publish, code)
        if failure is not None:
            log.error("deployment %s rolled back: %s", deployment.id, failure)
            self._on_switched(result)
            self._answer_rollbacks(result)
        return result

    def _reference(self, deployment: Deployment) -> Shadow | None:
        """The version `deployment` replaced, run beside it for probation's agreement check
        (None, said in the log, when there is none or it does not load: the check is skipped)."""
        info = self.store.info(deployment.from_sha)
        if info is None or self._open_shadow is None:
            log.info("deployment %s: no previous version to compare with on probation", deployment.id)
            return None
        try:
            return self._open_shadow(info.path, self.config.deployments.shadow.sample_share, "reference")
        except BundleError as exc:
            log.warning("deployment %s: probation's agreement check is skipped: %s", deployment.id, exc)
            return None

    def _shadow(self, desired: Desired, record: Deployment, verified: Verified, plan: ShadowPlan) -> Deployment:
        """Run the candidate beside the serving version and judge it (before the switch, in the
        installer's `before_switch`): the record in SHADOW with its `shadow` result, or REJECTED."""
        record = self._step(record, State.SHADOW)
        share = self.config.deployments.shadow.sample_share
        try:
            if self._open_shadow is None:
                raise BundleError(ErrorCode.SHADOW_UNAVAILABLE, "this agent serves no cameras: nothing to compare with")
            session = self._open_shadow(verified.folder, share)
        except BundleError as exc:
            log.error("deployment %s rejected: %s", record.id, exc)
            return self._step(record, State.REJECTED, exc)
        judge = ShadowJudge(plan, self._clock(), labelled(verified.manifest.labels))
        published = self._clock()
        try:
            while True:
                with self._lock:
                    self._lock.wait(self.shadow_check_s)
                    rollback_asked = bool(self._rollbacks)
                if self._stop.is_set():
                    raise _ShadowStopped
                ended = self._shadow_ended(desired, rollback_asked)
                if ended is not None:
                    record = self._step(
                        replace(record, shadow=judge.progress(session.reports(), self._clock())), State.REJECTED, ended
                    )
                    log.warning("deployment %s: %s", record.id, ended)
                    if rollback_asked:
                        self._answer_rollbacks(record)
                    return record
                now = self._clock()
                result = judge.observe(session.reports(), now)
                if result is not None:
                    break
                if now - published >= SHADOW_PROGRESS_S:
                    published = now
                    self._publish(replace(record, shadow=judge.progress(session.reports(), now)))
        finally:
            session.close()
        failed = {name: n for name, n in session.failures().items() if n}
        if failed:
            said = ", ".join(f"{name}: {n}" for name, n in sorted(failed.items()))
            result = replace(result, message=f"{result.message}; the candidate failed on frames ({said})")
        record = replace(record, shadow=result)
        log.info("deployment %s: shadow %s: %s", record.id, result.outcome, result.message)
        if passes(result, plan.quiet):
            self.store.record(record)  # the result kept with the record as it switches
            return record
        return self._step(record, State.REJECTED, BundleError(ErrorCode.SHADOW_DISAGREES, result.message))

    def _shadow_ended(self, desired: Desired, rollback_asked: bool) -> BundleError | None:
        """Why the shadow in progress ends before its judgement (None: it goes on)."""
        if rollback_asked:
            return BundleError(ErrorCode.CANCELLED, "cancelled by a rollback command during the shadow")
        if self._halted.is_set():
            return BundleError(ErrorCode.ROLLOUT_HALTED, f"the rollout of {desired.id} was halted during the shadow")
        if self._cancel.is_set() and (successor := self._successor(desired)) is not None:
            return BundleError(ErrorCode.SUPERSEDED, successor)
        return None

    def _labels(self, sha: str) -> list[str]:
        """The labels of the installed version `sha` (none when its manifest cannot be read:
        the record then names classes by id)."""
        info = self.store.info(sha)
        if info is None:
            return []
        try:
            return read_manifest(info.path)[1].labels
        except (OSError, BundleError) as exc:
            log.warning("deployment: cannot read the labels of %s: %s", sha[:12], exc)
            return []

    def _answer_rollbacks(self, rolled_back: Deployment) -> None:
        """Rollback commands that arrived during a probation are answered by its rollback."""
        with self._lock:
            requests, self._rollbacks = self._rollbacks, []
        for future in requests:
            future.set_result(rolled_back)

    @staticmethod
    def _retry_after_crash(last: Deployment) -> bool:
        """A deployment that ended without being followed was cut short by a crash (the record
        is final, `followed.json` not written yet). Retry it once if the crash came while
        verifying or installing (a power cut); never after a crash while activating or on
        probation or in its shadow, where the new model itself may be what took the process down."""
        interrupted = last.error is not None and last.error.code == ErrorCode.INTERRUPTED
        shadowed = any(state == State.SHADOW for state, _ in last.history)  # the candidate ran: it may be the cause
        return interrupted and last.state == State.REJECTED and last.attempt < 2 and not shadowed


def _is_agent_bundle(path: Path) -> bool:
    """Whether the downloaded bundle is an agent bundle (one that cannot be read: the model
    path's unpack says why)."""
    try:
        return bundle_kind(path) == "agent"
    except (BundleError, OSError):
        return False


def _halts_with_rollback(desired: Desired | None) -> bool:
    """Whether `desired` is a halted rollout whose devices roll back."""
    rollout = desired.rollout if desired is not None else None
    return rollout is not None and rollout.halted is not None and rollout.on_halt == "rollback"


def deployment_status(deployment: Deployment, progress: DownloadProgress | None = None) -> DeploymentStatus:
    """The record as the agent snapshot shows it."""
    return DeploymentStatus(
        id=deployment.id,
        name=deployment.name,
        version=deployment.version,
        sha256=deployment.sha256,
        state=deployment.state,
        error=deployment.error,
        attempt=deployment.attempt,
        progress=progress,
        shadow=bounded_shadow(deployment.shadow),
        quality=bounded_quality(deployment.quality),
    )
