"""``edge-agent run``: the daemon, composed.

`Agent` recovers an interrupted deployment, starts the cameras on the active version (if any),
connects to the broker (if configured) and keeps serving detections whether or not the broker
is reachable. It builds and wires the components, which own the threads: the sampler
(`agent.daemon.sampler`: readings and the governor every ``telemetry.interval_s``; with a
broker the agent publishes telemetry and status after each), and with a broker the link
(`MqttLink`), the deployer, the commands (`agent.daemon.command_service`) and the optimisation
reports (`agent.daemon.optimisation_report`); per camera a capture thread and the inference
workers. The main thread only waits for signals:

- SIGTERM / SIGINT: status ``stopping``, deployer stopped after its current step (a download
  resumes next time), pipelines joined, status ``offline``, clean disconnect.
- SIGHUP: reload the config file; a config with problems is refused (logged) and the running
  one kept: one that cannot start (`check_startable`) or one `config check` finds a problem in
  (`check_files`: a missing video file or key); a good one restarts the components with it.

`start` takes the state directory's lock (`StateDirLock`, ``<state_dir>/agent.lock``) before
it touches the store and `stop` lets go of it; a reload keeps it (or takes the new directory's
first): a second daemon on the same directory gets a `ConfigError` naming the holder's PID.

Under systemd (``$NOTIFY_SOCKET``) the main thread also tells systemd READY once the cameras
run and the broker was tried, keeps STATUS= current, pings the watchdog while `health()` is
ok, and says RELOADING and STOPPING (`agent.daemon.service`). The status page
(`agent.web.server`, its own threads) reaches the agent only through `AgentControls`.

`snapshot()` is the agent's state as one typed value (`AgentSnapshot`), readable from any
thread with or without a broker: the status and telemetry documents are made from it.
`health()` says whether every loop turns. The actions the commands and the page share are
`agent.daemon.actions`'. Events (`agent.event_values`) become JSON here, once: on the
``events`` topic and, the last 100, for the page.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.bundles.installer import InstallPolicy
from agent.bundles.record import Deployment
from agent.bundles.store import Store
from agent.config.loading import ConfigLines, check_files, load_config, security_warnings
from agent.config.models import AgentConfig
from agent.daemon.actions import DeviceActions
from agent.daemon.checkup import check_startable
from agent.daemon.command_service import CommandService
from agent.daemon.deployer import Deployer
from agent.daemon.documents import (
    deployment_report_payload,
    deployment_status,
    last_will,
    status_payload,
    telemetry_payload,
)
from agent.daemon.governing import Governing
from agent.daemon.media import FOLDER as MEDIA_FOLDER
from agent.daemon.media import MediaStore
from agent.daemon.optimisation_report import Reports
from agent.daemon.page import service_line, start_page
from agent.daemon.sampler import Sampler
from agent.daemon.service import Service
from agent.daemon.state_lock import StateDirLock
from agent.errors import BundleError, CodedError, ConfigError, ErrorCode
from agent.event_values import Event, ObjectEvent
from agent.hardware.board import Board
from agent.hardware.clock import clock_synchronised
from agent.hardware.sensors import Sensors
from agent.hardware.system import SystemMonitor
from agent.mqtt.control import ControlGate
from agent.mqtt.link import MqttLink, Will
from agent.mqtt.outbox import FILE_NAME, Kind, Outbox, SavedCount
from agent.mqtt.outbox_sender import OutboxSender
from agent.mqtt.protocol import Topics, json_payload
from agent.serving.cameras import Cameras
from agent.serving.classifying import ClassifyingStage
from agent.serving.events import EventSink, SavedTotal
from agent.snapshot import AgentSnapshot, AgentState, EventCounts, Health, Serving, VersionRef, judge_health
from agent.web.controls import AgentControls
from pipelines.pipeline import use_one_opencv_thread
from runtimes.base import RuntimeInfo, compact_malloc
from runtimes.registry import available_runtimes

if TYPE_CHECKING:
    from agent.web.server import StatusServer

log = logging.getLogger(__name__)

#: how long a clean stop waits for the outbox's messages in flight to be acknowledged (seconds)
DRAIN_S = 2.0


@functools.cache
def agent_version() -> str:
    try:
        return importlib.metadata.version("edge-agent")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


class Agent:
    """One device's daemon, built from its config; `run` blocks until stopped."""

    def __init__(
        self,
        config: AgentConfig,
        board: Board,
        config_path: Path | None = None,
        root: Path = Path("/"),
        pin_factory: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`root` is the filesystem the sensors read (a fake or captured tree in tests);
        `pin_factory` is gpiozero's, for a GPIO fan (None: gpiozero's default); `clock` is the
        wall clock (Unix seconds) that control documents and rollout waves are judged by."""
        self.board, self.config_path = board, config_path
        self.root, self.pin_factory, self.clock = root, pin_factory, clock
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._state_lock: StateDirLock | None = None  # held from `start` to `stop`, across reloads
        self._configure(config)

    def _configure(self, config: AgentConfig) -> None:
        """Build (not start) the components for `config`; raises `ConfigError` / `BundleError`."""
        self.config = config
        self.device = config.device_id()
        self.topics = Topics(config.mqtt.topic_root if config.mqtt else "edge")
        self.store = Store(config.state_dir, config.keep_versions)
        self.policy = InstallPolicy.from_config(config)
        self.gate = ControlGate.from_config(config, self.clock)
        self.warnings = security_warnings(config)
        # the outbox file also keeps the line and zone totals, so it is there with or without a broker
        self.outbox = Outbox(config.state_dir / FILE_NAME, config.outbox, self.clock)
        self._counts_lock = threading.Lock()
        self.classifying = ClassifyingStage()  # the second stage, when a version carries a classifier
        self.events = EventSink(
            config.events,
            self._labels,
            self._publish_event,
            config.pipelines,
            counted=self._save_counts,
            stage=self.classifying,
        )
        self._restore_counts()
        self.media: MediaStore | None = None  # the events' snapshots on disk (with events.snapshots)
        if config.events.snapshots:
            self.media = MediaStore(config.state_dir / MEDIA_FOLDER, config.events.media)
        self.cameras = Cameras(
            config.pipelines,
            self.board,
            config.runtime,
            self.events.for_pipeline,
            config.runtime_settings(),
            config.cameras,
            locate=ConfigLines.read(self.config_path).where,
            stage=self.classifying,
        )
        sensors = Sensors.from_config(config.sensors, self.root, self.board)
        governing = None
        if config.governor.enabled:
            governing = Governing.with_fan(
                config.governor, self.cameras, sensors.fs, self.pin_factory, self._publish_event, self._publish_status
            )
        monitor = SystemMonitor(disk_path=config.state_dir, clock=lambda: clock_synchronised(sensors.fs))
        self.sampler = Sampler(config.telemetry.interval_s, monitor, sensors, governing, self._publish_telemetry)
        self.link: MqttLink | None = None
        self.sender: OutboxSender | None = None  # sends the outbox's messages (with a broker)
        self.deployer: Deployer | None = None
        self.commands: CommandService | None = None
        self.reports: Reports | None = None
        self.actions = DeviceActions(self.store, self.cameras, lambda: self.deployer)
        self._state: AgentState = "starting"
        self._reported: tuple[str, str, int] | None = None  # the deployment step last reported
        self._runtimes: tuple[RuntimeInfo, ...] = ()  # probed at start, in child processes
        self.recent_events: deque[Event] = deque(maxlen=100)  # for the page, oldest first, without crops
        self.web: StatusServer | None = None
        if config.mqtt is not None:
            self.link = MqttLink(
                config.mqtt,
                config.mqtt.client_id or f"edge-agent-{self.device}",
                will=Will(self.topics.status(self.device), last_will(self.device)),
                on_connect=self._publish_status,
            )
            self.sender = OutboxSender(self.outbox, self.link, config.outbox)
            actions = replace(
                self.actions.commands(lambda: self._state, self.clock),
                reset_counts=self._reset_counts,
                media=self._media_jpeg if self.media is not None else None,
            )
            self.commands = CommandService(self.link, self.topics, self.device, self.gate, actions)
            if config.deployments.report:
                report = functools.partial(self.link.publish_state, self.topics.report(self.device))
                settings, frames = config.runtime_settings(), config.deployments.report_frames
                self.reports = Reports(self.store, self.device, self.board, settings, frames, report)

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        signal.signal(signal.SIGHUP, lambda *_: self._reload.set())
        service = Service.from_environment()
        self.start()
        service.ready(self.link, self.service_status)
        try:
            while not self._stop.wait(service.tick_s):
                if self._reload.is_set():
                    self._reload.clear()
                    service.reloading()
                    self.reload()
                    service.ready(self.link, self.service_status)
                if service.notifier.enabled:
                    service.tick(self.health, self.service_status)
        finally:
            service.stopping()
            self.stop()
        return 0

    def start(self) -> None:
        use_one_opencv_thread()
        compact_malloc()  # freed frames and tensors go back to the system, not to per-thread arenas
        self.store.ensure()
        if self._state_lock is None:
            self._state_lock = StateDirLock(self.config.state_dir).acquire()  # before the store is touched
        recovered = self.store.recover()
        if recovered is not None:
            log.warning("recovered deployment %s: now %s", recovered.id, recovered.state)
        for warning in [*self.warnings, *self.store.problems]:
            log.warning("%s", warning)
        self._runtimes = tuple(available_runtimes().values())  # once per process: a SIGHUP reuses it
        self.classifying.start()
        self.actions.serve_current()
        self._state = "online"
        self.sampler.start()
        if self.link is not None:
            assert self.commands is not None
            self.deployer = Deployer(
                self.config,
                self.device,
                self.store,
                self.board,
                self.link,
                self.topics,
                self.policy,
                self.gate,
                self._on_deployed,
                camera_stats=self.cameras.stats,
                on_succeeded=self.reports.on_succeeded if self.reports is not None else lambda deployment: None,
                wall_clock=self.clock,
                on_report=self._report_deployment,
            )
            self.commands.start()
            self.link.start()
            if self.sender is not None:
                self.sender.start()
            self.deployer.start()
        self.web = start_page(self.config.status_page, self.page_controls)
        log.info(
            "edge-agent %s running as %s (%s), %d pipeline(s), broker %s",
            agent_version(),
            self.device,
            self.board.model,
            len(self.config.pipelines),
            self.config.mqtt.broker if self.config.mqtt else "none",
        )

    def stop(self) -> None:
        """Stop every component, then let go of the state directory."""
        self._stop_components()
        if self._state_lock is not None:
            self._state_lock.release()
            self._state_lock = None

    def _stop_components(self) -> None:
        log.info("stopping")
        self._state = "stopping"
        if self.web is not None:
            self.web.stop()
            self.web = None
        self._publish_status()
        if self.deployer is not None:
            self.deployer.stop()
        self.sampler.stop()
        for component in (self.commands, self.reports):
            if component is not None:
                component.stop()
        self.cameras.stop()
        self.events.finish()  # the objects still tracked get their `end` while the link is up
        self.classifying.stop()
        self._state = "offline"
        if self.link is not None:
            self._publish_status()
            if self.sender is not None:
                self.sender.drain(DRAIN_S)  # what is already on its way gets its acknowledgement
                self.sender.stop()
            self.link.stop()
        self._save_counts()
        self.outbox.close()
        log.info("stopped")

    def reload(self) -> None:
        if self.config_path is None:
            log.warning("SIGHUP: no config file to reload")
            return
        lock = self._state_lock
        try:
            config = load_config(self.config_path)
            check_startable(config)
            if problems := check_files(config):  # what `config check` reports: a missing video file
                raise ConfigError(f"{'; '.join(problems)} (edge-agent config check {self.config_path})")
            if lock is None or lock.state_dir != config.state_dir:
                lock = StateDirLock(config.state_dir).acquire()  # a new state directory: taken first
        except (ConfigError, BundleError, OSError) as exc:
            log.error("SIGHUP: keeping the running config: %s", exc)
            return
        log.info("SIGHUP: reloading %s", self.config_path)
        self._stop_components()
        if self._state_lock is not None and self._state_lock is not lock:
            self._state_lock.release()
        self._state_lock = lock
        self._configure(config)
        self.start()

    def _on_deployed(self, deployment: Deployment) -> None:
        self.actions.serve_current()
        self._publish_status()

    def _labels(self) -> list[str]:
        manifest = self.cameras.manifest
        return manifest.labels if manifest else []

    # -- the snapshot --------------------------------------------------------------------------

    def snapshot(self, state: AgentState | None = None) -> AgentSnapshot:
        """The agent now (any thread); `state` overrides the lifecycle state (the last will)."""
        state = state or self._state
        current = self.store.info(self.store.current_sha())
        previous = self.store.info(self.store.previous_sha())
        choice = self.cameras.choice
        deployer = self.deployer
        deployment = deployer.latest if deployer is not None else None
        if deployment is None and (record := self.store.last_deployment()) is not None:
            deployment = deployment_status(record)
        stage = self.classifying.counts()
        return AgentSnapshot(
            ts=time.time(),
            state=state,
            device=self.device,
            group=self.config.device.group,
            agent_version=agent_version(),
            board=self.board,
            bundle=VersionRef(current.name, current.version, current.sha256) if current else None,
            previous=VersionRef(previous.name, previous.version, previous.sha256) if previous else None,
            serving=Serving(choice.runtime, choice.device, Path(choice.artifact.path).name, choice.reason)
            if choice
            else None,
            serving_error=self.actions.serving_error,
            deployment=deployment,
            deployment_problem=deployer.problem if deployer is not None else None,
            warnings=(*self.warnings, *self.store.problems),
            cameras=tuple(self.cameras.stats()) if state != "offline" else (),
            broker=self.link.stats() if self.link is not None else None,
            system=self.sampler.system,
            events=EventCounts(self.events.published, self.events.suppressed, stage.classified, stage.dropped),
            analytics=tuple(self.events.counts()),
            sensors=self.sampler.readings,
            governor=self.sampler.governor,
            rollout=deployer.rollout if deployer is not None else None,
            runtimes=self._runtimes,
            engine=self.cameras.engine_status(),
            thresholds=tuple(self.cameras.thresholds()) if state != "offline" else (),
            outbox=self.outbox.stats() if self.link is not None else None,
            analytics_since=self.events.since,
            media=self.media.usage() if self.media is not None else None,
        )

    # -- publishing ----------------------------------------------------------------------------

    def _publish_status(self) -> None:
        if self.link is not None:
            self.link.publish_state(self.topics.status(self.device), status_payload(self.snapshot()))

    def _send(self, kind: Kind, topic: str, payload: bytes) -> None:
        """Into the outbox, which sends it once the link is up and forgets it at its PUBACK; a
        write the disk refuses goes to the link's in-memory queue instead (never raises)."""
        assert self.link is not None
        if self.outbox.append(kind, topic, payload) is not None:
            if self.sender is not None:
                self.sender.wake()
            return
        self.link.publish_queued(topic, payload, qos=1)

    def _publish_event(self, event: Event) -> None:
        """An object or governor event (a camera's inference thread, the sampler): on the
        ``events`` topic with the device first (through the outbox), and into the page's recent
        events."""
        if isinstance(event, ObjectEvent) and event.snapshot_jpeg is not None and self.media is not None:
            name = self.media.put(event.object_id, event.snapshot_jpeg)
            if name is not None:  # else (the disk refused it) the crop goes in the event as before
                event = replace(event, snapshot_jpeg=None, snapshot=name)
        self.recent_events.append(event.without_crop())  # the page lists, not crops
        if self.link is not None:
            document = {"device": self.device, **event.to_json()}
            self._send("event", self.topics.events(self.device), json_payload(document))

    def _report_deployment(self, deployment: Deployment) -> None:
        """Each new state of a deployment record (the deployer's thread) as a report on
        ``deployments`` through the outbox; the retained ``deployment`` document stays as it was."""
        step = (deployment.id, deployment.state, len(deployment.history))
        if self.link is None or step == self._reported:
            return
        self._reported = step
        self._send(
            "deployment", self.topics.deployments(self.device), deployment_report_payload(self.device, deployment)
        )

    def _publish_telemetry(self) -> None:
        """After each sample (the sampler thread): with a broker, telemetry (through the outbox)
        and the status (which keeps the retained fps current for `fleet status`)."""
        if self.link is not None:
            snapshot = self.snapshot()
            self._send("telemetry", self.topics.telemetry(self.device), telemetry_payload(snapshot))
            self.link.publish_state(self.topics.status(self.device), status_payload(snapshot))

    def _media_jpeg(self, event_id: str) -> bytes:
        """The ``media`` command: the snapshot kept for an event. Raises `CodedError` ``NO_MEDIA``."""
        jpeg = self.media.get(event_id) if self.media is not None else None
        if jpeg is None:
            raise CodedError(ErrorCode.NO_MEDIA, f"no snapshot of event {event_id} is kept here (gone by retention?)")
        return jpeg

    # -- line and zone totals across restarts ----------------------------------------------------

    def _restore_counts(self) -> None:
        """The totals kept before this start (docs/analytics.md): counting goes on from them."""
        saved = self.outbox.counts()
        totals = []
        for count in saved:
            kind, _, name = count.name.partition(":")
            if kind == "line":
                totals.append(SavedTotal(count.pipeline, "line", name, count.a, count.b))
            elif kind == "zone":
                totals.append(SavedTotal(count.pipeline, "zone", name, count.a, count.b))
        if saved:
            self.events.restore(totals, min(count.since for count in saved))

    def _save_counts(self) -> None:
        """Keep every total now (a camera's inference thread, after a frame changed one; the
        stop): one transaction, so a kill keeps every crossing counted before it."""
        with self._counts_lock:
            since = self.events.since
            rows = [SavedCount(t.camera, f"{t.kind}:{t.name}", t.a, t.b, since) for t in self.events.totals()]
            self.outbox.save_counts(rows, replace=True)

    def _reset_counts(self) -> dict[str, Any]:
        """The ``reset-counts`` command: every total to zero from now; answers the new `since`
        and the totals it cleared."""
        before = AgentSnapshot.analytics_of(tuple(self.events.counts()))
        since = self.events.reset()
        log.info("reset-counts: the line and zone totals count from zero again")
        return {"since": round(since, 3), "before": before}

    # -- health, systemd and the page -----------------------------------------------------------

    def health(self) -> Health:
        """Whether the cameras' threads, the MQTT link's loop, the sampler, the classify thread
        and the commands thread turn (any thread)."""
        broker = self.link.stats() if self.link is not None else None
        commands = (self.commands.loop(),) if self.commands is not None else ()
        loops = (self.sampler.loop(), self.classifying.loop(), *commands)
        return judge_health(tuple(self.cameras.stats()), broker, loops, self.config.health.stall_s)

    def page_controls(self) -> AgentControls:
        """What the status page may read and do (every callable from any thread)."""
        return self.actions.controls(self.snapshot, self.health, lambda: list(self.recent_events))

    def service_status(self) -> str:
        """One line for systemd's STATUS=: what is served, the cameras, the broker, the governor."""
        return service_line(self.snapshot())
