"""``edge-agent run``: the daemon, composed.

`Agent` recovers an interrupted deployment, starts the cameras on the active version (if any),
connects to the broker (if configured) and keeps serving whether or not it is reachable. It
builds and wires the components, which own the threads: the sampler (readings and the
governor), what the device sends (`agent.daemon.outgoing`), the totals across restarts
(`agent.daemon.totals`), the clips, the second stage, and with a broker the link, the outbox's
sender, the deployer, the commands, Home Assistant's feed and the optimisation reports; per
camera a capture thread and the inference workers. The main thread waits for signals
(`agent.daemon.service.run_until_signalled`): SIGTERM / SIGINT stop every component (a
download resumes next time); SIGHUP applies a config `checkup.reloadable` passes, else keeps
the running one. `start` takes ``<state_dir>/agent.lock`` before it touches the store, `stop`
lets go of it, a reload keeps it. The page reaches the agent only through `AgentControls`;
`snapshot()` is the agent's state as one typed value, readable from any thread.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import __version__
from agent.bundles.installer import InstallPolicy
from agent.bundles.record import Deployment
from agent.bundles.store import Store
from agent.config.loading import ConfigLines, config_warnings
from agent.config.models import AgentConfig
from agent.daemon.actions import DeviceActions
from agent.daemon.checkup import reloadable
from agent.daemon.clips import media_for, with_clips
from agent.daemon.command_service import CommandService
from agent.daemon.documents import deployment_payload, last_will
from agent.daemon.governing import Governing
from agent.daemon.ha_feed import feed_for
from agent.daemon.outgoing import Outgoing
from agent.daemon.page import service_line, start_page
from agent.daemon.sampler import Sampler
from agent.daemon.service import Restarts, run_until_signalled
from agent.daemon.state_lock import StateDirLock
from agent.daemon.totals import KeptTotals
from agent.deployment.deployer import Deployer, deployment_status
from agent.deployment.optimisation_report import Reports
from agent.errors import BundleError, CodedError, ConfigError, ErrorCode
from agent.event_values import CameraEndReason, CameraEvent
from agent.hardware.board import Board
from agent.hardware.clock import clock_synchronised
from agent.hardware.sensors import Sensors
from agent.hardware.system import SystemMonitor
from agent.mqtt.commands import SamplesArgs
from agent.mqtt.control import ControlGate
from agent.mqtt.home_assistant import Identity
from agent.mqtt.link import MqttLink, Will
from agent.mqtt.outbox import FILE_NAME, Outbox
from agent.mqtt.outbox_sender import OutboxSender
from agent.mqtt.protocol import Topics
from agent.serving.cameras import Cameras
from agent.serving.classifying import ClassifyingStage
from agent.serving.drift_watch import DriftWatch
from agent.serving.events import EventSink
from agent.serving.samples import samples_for
from agent.snapshot import AgentSnapshot, AgentState, EventCounts, Health, Serving, VersionRef, judge_health
from agent.web.controls import AgentControls, SamplesKept
from pipelines.decoding.detections import Detections
from pipelines.health_watch import ProblemSeen
from pipelines.pipeline import Sink, use_one_opencv_thread
from pipelines.sources.frames import Frame
from runtimes.base import RuntimeInfo, compact_malloc
from runtimes.registry import ProbeCache, available_runtimes, plugin_problems

if TYPE_CHECKING:
    from agent.web.server import StatusServer

log = logging.getLogger(__name__)

#: how long a clean stop waits for the outbox's messages in flight to be acknowledged (seconds)
DRAIN_S = 2.0


def agent_version() -> str:
    """The version of the code that runs: `agent.__version__` (docs/fleet.md#versions), not the
    installed distribution's metadata, which an editable install keeps from when it was made."""
    return __version__


class Agent:
    """One device's daemon, built from its config; `run` blocks until stopped."""

    # built in `_configure` after the callbacks that reach them
    cameras: Cameras
    totals: KeptTotals
    outgoing: Outgoing
    actions: DeviceActions

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
        self._state_lock: StateDirLock | None = None  # held from `start` to `stop`, across reloads
        self._configure(config)

    def _configure(self, config: AgentConfig) -> None:
        """Build (not start) the components for `config`; raises `ConfigError` / `BundleError`."""
        self.config = config
        self.device = config.device_id()
        self.topics = Topics(config.mqtt.topic_root if config.mqtt else "edge")
        self.store = Store(config.state_dir, config.keep_versions, config.runtime_settings())
        self.policy = InstallPolicy.from_config(config)
        self.gate = ControlGate.from_config(config, self.clock)
        self.warnings = config_warnings(config)
        # the outbox file also keeps the line and zone totals, so it is there with or without a broker
        self.outbox = Outbox(config.state_dir / FILE_NAME, config.outbox, self.clock)
        self.link: MqttLink | None = None
        self.sender: OutboxSender | None = None  # sends the outbox's messages (with a broker)
        if config.mqtt is not None:
            self.link = MqttLink(
                config.mqtt,
                config.mqtt.client_id or f"edge-agent-{self.device}",
                will=Will(self.topics.status(self.device), last_will(self.device, agent_version())),
                on_connect=lambda: self.outgoing.connected(),
            )
            self.sender = OutboxSender(self.outbox, self.link, config.outbox)
        media, self.clips = media_for(config)  # the events' snapshots and clips on disk
        # samples for retraining (issue 40 item 3); `samples_flagged(camera)`: drift's and health's verdict
        self.samples = samples_for(
            config.cameras, config.state_dir, lambda: self.cameras.labels(), self._serving_version, self.samples_flagged
        )
        identity, jpeg = Identity(self.device, self.board.model, agent_version()), self._camera_jpeg
        self.home_assistant = feed_for(config, identity, self.topics, self.link, jpeg, time.monotonic)
        parts = (self.link, self.sender, media, self.clips, self.home_assistant)
        self.outgoing = Outgoing(self.device, self.topics, self.outbox, self.snapshot, *parts)
        labels, counted = (lambda: self.cameras.labels()), (lambda: self.totals.save())  # both built below
        self.classifying = ClassifyingStage()  # the second stage, when a version carries a classifier
        self.events = EventSink(
            config.events, labels, self.outgoing.event, config.cameras, counted=counted, stage=self.classifying
        )
        self.totals = KeptTotals(self.outbox, self.events)
        self.totals.restore()
        self.drift = DriftWatch(config.cameras, config.state_dir, self._serving_key, lambda: self.cameras.labels())
        self.cameras = Cameras(
            config.cameras,
            self.board,
            config.runtime,
            lambda name: self.drift.after(name, self._sink_for(name)),
            config.runtime_settings(),
            config.serving,
            locate=ConfigLines.read(self.config_path).where,
            stage=self.classifying,
            tracks_alive_for=lambda name: self.events.scene(name).tracks_alive,
            health_changed=self._camera_health_changed,
        )
        if self.samples is not None:  # frames a shadow disagreed on are samples too
            self.cameras.shadow_disagreed = self._shadow_sample
        sensors = Sensors.from_config(config.sensors, self.root, self.board)
        governing = None
        if config.governor.enabled:
            governing = Governing.with_fan(
                config.governor, self.cameras, sensors.fs, self.pin_factory, self.outgoing.event, self.outgoing.status
            )
        monitor = SystemMonitor(disk_path=config.state_dir, clock=lambda: clock_synchronised(sensors.fs))
        self.sampler = Sampler(config.telemetry.interval_s, monitor, sensors, governing, self.outgoing.telemetry)
        self.deployer: Deployer | None = None
        self.commands: CommandService | None = None
        self.reports: Reports | None = None
        self.actions = DeviceActions(self.store, self.cameras, lambda: self.deployer)
        self._state: AgentState = "starting"
        self._runtimes: tuple[RuntimeInfo, ...] = ()  # probed at start, in child processes
        self.web: StatusServer | None = None
        if self.link is not None:
            actions = replace(
                self.actions.commands(lambda: self._state, self.clock),
                reset_counts=self.totals.reset,
                media=self.outgoing.media_jpeg if media is not None else None,
                clip=self.outgoing.media_clip if self.clips is not None else None,
                samples=self._samples_answer if self.samples is not None else None,
            )
            self.commands = CommandService(self.link, self.topics, self.device, self.gate, actions)
            if config.deployments.report:
                report = functools.partial(self.link.publish_state, self.topics.report(self.device))
                settings, frames = config.runtime_settings(), config.deployments.report_frames
                self.reports = Reports(
                    store=self.store,
                    device=self.device,
                    board=self.board,
                    settings=settings,
                    frames=frames,
                    publish=report,
                )

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self, restarts: Restarts | None = None) -> int:
        """Serve until SIGTERM / SIGINT, reloading on SIGHUP, under systemd or not; `restarts`:
        the agent's own version switch (returns `agent_switch.RESTART` when it asks)."""
        return run_until_signalled(self, restarts=restarts)

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
        cache = ProbeCache(self.config.probe_cache_path(), __version__)  # the last start's, while still true
        self._runtimes = tuple(available_runtimes(cache=cache).values())  # once per process: a SIGHUP reuses it
        self.classifying.start()
        self.actions.serve_current()
        self._state = "online"
        self.sampler.start()
        if self.link is not None:
            self.deployer = Deployer(
                config=self.config,
                device=self.device,
                store=self.store,
                board=self.board,
                link=self.link,
                topics=self.topics,
                policy=self.policy,
                gate=self.gate,
                on_switched=self._on_deployed,
                payload=deployment_payload,
                camera_stats=self.cameras.stats,
                on_succeeded=self.reports.on_succeeded if self.reports is not None else lambda deployment: None,
                wall_clock=self.clock,
                on_report=self.outgoing.deployment_report,
                open_shadow=self.cameras.shadow,
            )
        if self.samples is not None:
            self.samples.start()
        for component in (self.clips, self.commands, self.home_assistant, self.link, self.sender, self.deployer):
            if component is not None:
                component.start()
        self.web = start_page(self.config.status_page, self.page_controls)
        broker = self.config.mqtt.broker if self.config.mqtt else "none"
        facts = (agent_version(), self.device, self.board.model, len(self.config.cameras), broker)
        log.info("edge-agent %s running as %s (%s), %d pipeline(s), broker %s", *facts)

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
        self.outgoing.status()
        for component in (self.deployer, self.sampler, self.commands, self.reports):
            if component is not None:
                component.stop()
        self.cameras.stop()
        self.events.finish()  # the objects still tracked get their `end` while the link is up
        if self.clips is not None:
            self.clips.finish()  # clips in the making are written with the frames they have
            self.clips.stop()
        if self.samples is not None:
            self.samples.stop()  # what is queued is written
        self.classifying.stop()
        self._state = "offline"
        if self.link is not None:
            self.outgoing.status()
            if self.sender is not None:
                self.sender.drain(DRAIN_S)  # what is already on its way gets its acknowledgement
                self.sender.stop()
            self.link.stop()
        self.totals.save()
        self.outbox.close()
        log.info("stopped")

    def reload(self) -> None:
        """Apply the config file again when `checkup.reloadable` passes it. A refusal is logged as
        ``SIGHUP: keeping the running config: ...`` and changes nothing, whatever checking the new
        config raised (a bounded loader's `ConfigError`, or a RecursionError, MemoryError or bug)."""
        if self.config_path is None:
            log.warning("SIGHUP: no config file to reload")
            return
        lock = self._state_lock
        try:
            config = reloadable(self.config_path)
            if lock is None or lock.state_dir != config.state_dir:
                lock = StateDirLock(config.state_dir).acquire()  # a new state directory: taken first
        except (ConfigError, BundleError, OSError) as exc:
            log.error("SIGHUP: keeping the running config: %s", exc)
            return
        except Exception as exc:  # RecursionError, MemoryError, a bug: nothing in a file may end the daemon
            what = f"{type(exc).__name__}: {exc}".rstrip(": ")
            log.error("SIGHUP: keeping the running config: %s", what, exc_info=True)
            return
        log.info("SIGHUP: reloading %s", self.config_path)
        self._stop_components()
        if self._state_lock is not None and self._state_lock is not lock:
            self._state_lock.release()
        self._state_lock = lock
        previous = self.cameras
        self._configure(config)
        # a problem still present is not announced again; a check left behind ends its problems
        for watch, reason in self.cameras.keep_health_of(previous):
            state = watch.state
            self._camera_health_changed(watch.camera, (), state.problems if state is not None else (), reason)
        self.start()

    # -- samples for retraining (issue 40 item 3) -----------------------------------------------

    def samples_flagged(self, camera: str) -> bool:
        """Whether drift (its score at its threshold) or camera health (a problem now) flagged
        `camera`, whose frames are then kept as samples (reason ``flagged``)."""
        if self.drift.drifted(camera):
            return True
        try:
            state = self.cameras.health_watch(camera).state
        except KeyError:  # no health check on this camera
            return False
        return state is not None and bool(state.problems)

    def _sink_for(self, name: str) -> Sink:
        """Camera `name`'s sink: the samples' choice, the clips' ring, then the events (the
        drift watch follows them all: see `__init__`)."""
        sink = with_clips(self.clips, name, self.events.for_pipeline(name))
        return sink if self.samples is None else self.samples.sink(name, sink)

    def _serving_version(self) -> str | None:
        manifest = self.cameras.manifest
        return None if manifest is None else manifest.version

    def _shadow_sample(self, camera: str, frame: Frame, serving: Detections) -> None:
        if self.samples is not None:
            self.samples.offer(camera, frame, serving, "shadow")

    def _samples_answer(self, args: SamplesArgs) -> tuple[bytes, Mapping[str, Any]]:
        if self.samples is None:
            raise CodedError(ErrorCode.NO_MEDIA, "this device keeps no samples")
        return self.samples.packed(args.camera, args.since, args.until, args.limit)

    def _samples_kept(self) -> dict[str, SamplesKept]:
        found = self.samples.summary() if self.samples is not None else {}
        return {name: SamplesKept(*kept) for name, kept in found.items()}

    # -- end of samples for retraining ----------------------------------------------------------

    def _camera_jpeg(self, name: str, quality: int) -> bytes:
        return self.actions.camera_jpeg(name, quality)

    def _serving_key(self) -> str | None:
        """The drift's key of the version serving: its folder in the store, named by its digest."""
        version = self.cameras.version
        return version.name if version is not None else None

    def _camera_health_changed(
        self,
        camera: str,
        started: tuple[ProblemSeen, ...],
        cleared: tuple[ProblemSeen, ...],
        reason: CameraEndReason | None = None,
    ) -> None:
        """A camera's health problems that started or cleared (its capture thread; a reload's,
        with the `reason` its check ended): a ``camera`` event each, on the ``events`` topic and
        the page."""
        now = self.clock()
        for problem in started:
            self.outgoing.event(CameraEvent.of(camera, problem, "start", now))
        for problem in cleared:
            self.outgoing.event(CameraEvent.of(camera, problem, "end", now, reason))

    def _on_deployed(self, deployment: Deployment) -> None:
        self.actions.serve_current()
        self.outgoing.status()

    # -- the snapshot --------------------------------------------------------------------------

    def snapshot(self, state: AgentState | None = None) -> AgentSnapshot:
        """The agent now (any thread); `state` overrides the lifecycle state (the last will)."""
        state = state or self._state
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
            bundle=VersionRef.of(self.store.info(self.store.current_sha())),
            previous=VersionRef.of(self.store.info(self.store.previous_sha())),
            serving=Serving.of(self.cameras.choice),
            serving_error=self.actions.serving_error,
            deployment=deployment,
            deployment_problem=deployer.problem if deployer is not None else None,
            warnings=(*self.warnings, *self.store.problems),
            runtime_plugins=tuple(plugin_problems()),
            cameras=tuple(self.cameras.stats()) if state != "offline" else (),
            broker=self.link.stats() if self.link is not None else None,
            system=self.sampler.system,
            events=EventCounts(self.events.published, self.events.suppressed, stage.classified, stage.dropped),
            analytics=tuple(self.events.counts()),
            sensors=self.sampler.readings,
            energy=self.sampler.energy.energy,
            governor=self.sampler.governor,
            rollout=deployer.rollout if deployer is not None else None,
            runtimes=self._runtimes,
            engine=self.cameras.engine_status(),
            thresholds=tuple(self.cameras.thresholds()) if state != "offline" else (),
            motion=tuple(self.cameras.motion()) if state != "offline" else (),
            outbox=self.outbox.stats() if self.link is not None else None,
            analytics_since=self.events.since,
            media=self.outgoing.media_usage(),
            drift=self.drift.reports() if state != "offline" else (),
        )

    # -- health, systemd and the page -----------------------------------------------------------

    def health(self) -> Health:
        """Whether the cameras' threads, the MQTT link's loop, the sampler's, the classify, the
        commands', the outbox sender's, the clips', the samples' and the deployer's threads turn, and none
        fails its turns or would not stop (any thread)."""
        broker = self.link.stats() if self.link is not None else None
        owners = (self.classifying, self.commands, self.outgoing, self.clips, self.samples, self.deployer)
        others = (c.loop() for c in owners if c is not None)
        loops = (self.sampler.loop(), *others)
        return judge_health(tuple(self.cameras.stats()), broker, loops, self.config.health.stall_s)

    def page_controls(self) -> AgentControls:
        """What the status page may read and do (every callable from any thread)."""
        controls = self.actions.controls(self.snapshot, self.health, lambda: list(self.outgoing.recent))
        samples = self._samples_kept if self.samples is not None else None
        return replace(controls, media=self.outgoing.page_media, samples=samples)

    def service_status(self) -> str:
        """One line for systemd's STATUS=: what is served, the cameras, the broker, the governor."""
        return service_line(self.snapshot())
