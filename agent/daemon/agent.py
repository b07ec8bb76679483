"""``edge-agent run``: the daemon.

It recovers an interrupted deployment, starts the cameras on the active version (if any),
connects to the broker (if configured) and keeps serving detections whether or not the broker
is reachable. Threads: the sampler (system and sensor readings every
``telemetry.interval_s``, which also step the thermal and battery governor; with a broker it
publishes telemetry and status), and with a broker paho's network thread (via
`MqttLink`), the link's supervisor, the deployer and one thread for commands; per camera one
for capture and one per inference worker. The main thread only waits for signals:

- SIGTERM / SIGINT: status ``stopping``, deployer stopped after its current step (a download
  resumes next time), pipelines joined, status ``offline``, clean disconnect.
- SIGHUP: reload the config file; a config with problems is refused (logged) and the running
  one kept; a good one restarts the components with it.

Under systemd (``$NOTIFY_SOCKET``) the main thread also tells systemd READY once the cameras
run and the broker was tried, keeps STATUS= current, pings the watchdog while `health()` is
ok, and says RELOADING and STOPPING (`agent.daemon.service`). With ``status_page`` configured,
the page runs in threads of its own (`agent.web.server`) and reaches the agent only through
the `AgentControls` made here.

`snapshot()` is the agent's state as one typed value (`AgentSnapshot`), readable from any
thread with or without a broker: the status and telemetry documents are made from it.
`health()` says whether every loop turns; `rollback()`, `restart_camera()` and `camera_jpeg()`
are the actions shared by the MQTT commands and the page.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.bundles.install import InstallPolicy, rollback
from agent.bundles.record import Deployment, atomic_write
from agent.bundles.signing import load_public_key
from agent.bundles.store import Store
from agent.bundles.tuning import Tuning
from agent.config.loading import load_config, security_warnings
from agent.config.models import AgentConfig
from agent.daemon.deployer import Deployer
from agent.daemon.governing import Governing
from agent.daemon.page import service_line, start_page
from agent.daemon.service import Service
from agent.daemon.telemetry import deployment_status, status_document, telemetry_document
from agent.errors import BundleError, CodedError, ConfigError, ErrorCode
from agent.hardware.clock import clock_synchronised
from agent.hardware.fan import FanError, open_fan
from agent.hardware.probe import Board
from agent.hardware.readings import SensorReadings
from agent.hardware.sensors import Sensors
from agent.hardware.system import SystemMonitor, SystemReadings
from agent.mqtt.commands import (
    Command,
    NoArgs,
    PipelineArgs,
    RateLimits,
    Response,
    SnapshotArgs,
    ThrottledLog,
    run_command,
    shorten,
)
from agent.mqtt.control import ControlGate, SeenIds
from agent.mqtt.link import Message, MqttLink, Will
from agent.mqtt.protocol import COMMANDS, Topics, json_payload
from agent.serving.cameras import Cameras
from agent.serving.events import EventSink
from agent.snapshot import AgentSnapshot, AgentState, EventCounts, Health, Serving, VersionRef, judge_health
from pipelines.pipeline import use_one_opencv_thread
from runtimes.base import RuntimeInfo, compact_malloc
from runtimes.registry import available_runtimes

if TYPE_CHECKING:
    from agent.web.server import StatusServer

log = logging.getLogger(__name__)


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
        self._configure(config)

    def _configure(self, config: AgentConfig) -> None:
        """Build (not start) the components for `config`; raises `ConfigError` / `BundleError`."""
        self.config = config
        self.device = config.device_id()
        self.topics = Topics(config.mqtt.topic_root if config.mqtt else "edge")
        self.store = Store(config.state_dir, config.keep_versions)
        self.policy = InstallPolicy.from_config(config)
        self.gate = ControlGate(
            [load_public_key(path) for path in config.operator_keys],
            config.allow_unsigned_control,
            config.max_clock_skew_s,
            self.device,
            config.device.group,
            SeenIds(config.state_dir / "control.json", keep_s=2 * config.max_clock_skew_s),
            clock=self.clock,
        )
        self.warnings = security_warnings(config)
        self._limits = RateLimits(COMMANDS)
        self._throttled = ThrottledLog(log)
        self.events = EventSink(config.events, self._labels, self._publish_event, config.pipelines)
        self.cameras = Cameras(
            config.pipelines,
            self.board,
            config.runtime,
            self.events.for_pipeline,
            config.runtime_settings(),
            config.cameras,
        )
        self.sensors = Sensors.from_config(config.sensors, self.root, self.board)
        self.monitor = SystemMonitor(disk_path=config.state_dir, clock=lambda: clock_synchronised(self.sensors.fs))
        self._readings: SensorReadings | None = None  # the sampler's latest sensor reading
        self.governing = self._governing(config) if config.governor.enabled else None
        self.link: MqttLink | None = None
        self.deployer: Deployer | None = None
        self._state: AgentState = "starting"
        self._serving_error: str | None = None
        self._system: SystemReadings | None = None  # the sampler's latest reading
        self._runtimes: tuple[RuntimeInfo, ...] = ()  # probed at start, in child processes
        self._commands: queue.Queue[Message | None] = queue.Queue(maxsize=64)
        self._threads: list[threading.Thread] = []
        self._components_stop = threading.Event()
        self.recent_events: deque[dict[str, object]] = deque(maxlen=100)  # for the page, oldest first
        self._sampler_due = time.monotonic()  # when the sampler promised to turn again
        self._rollback_lock = threading.Lock()  # rollbacks without a deployer, one at a time
        self.web: StatusServer | None = None
        if config.mqtt is not None:
            self.link = MqttLink(
                config.mqtt,
                config.mqtt.client_id or f"edge-agent-{self.device}",
                will=Will(self.topics.status(self.device), json_payload({"state": "offline", "device": self.device})),
                on_connect=self._publish_status,
            )

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
        recovered = self.store.recover()
        if recovered is not None:
            log.warning("recovered deployment %s: now %s", recovered.id, recovered.state)
        for warning in [*self.warnings, *self.store.problems]:
            log.warning("%s", warning)
        self._runtimes = tuple(available_runtimes().values())  # once per process: a SIGHUP reuses it
        self._serve_current()
        self._state = "online"
        self._components_stop.clear()
        self._sample()
        self._spawn(self._sampler_loop, "sampler")
        if self.link is not None:
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
                on_succeeded=self._on_succeeded,
                wall_clock=self.clock,
            )
            self.link.subscribe(self.topics.command(self.device, "+"), self._enqueue_command)
            self.link.start()
            self.deployer.start()
            self._spawn(self._command_loop, "commands")
        self.web = start_page(self)
        log.info(
            "edge-agent %s running as %s (%s), %d pipeline(s), broker %s",
            agent_version(),
            self.device,
            self.board.model,
            len(self.config.pipelines),
            self.config.mqtt.broker if self.config.mqtt else "none",
        )

    def stop(self) -> None:
        log.info("stopping")
        self._state = "stopping"
        if self.web is not None:
            self.web.stop()
            self.web = None
        self._publish_status()
        if self.deployer is not None:
            self.deployer.stop()
        self._components_stop.set()
        self._commands.put(None)
        for thread in self._threads:
            thread.join(10.0)
        self._threads.clear()
        self.cameras.stop()
        self.events.finish()  # the objects still tracked get their `end` while the link is up
        self.sensors.close()
        if self.governing is not None:
            self.governing.close()
        self._state = "offline"
        if self.link is not None:
            self._publish_status()
            self.link.stop()
        log.info("stopped")

    def reload(self) -> None:
        if self.config_path is None:
            log.warning("SIGHUP: no config file to reload")
            return
        try:
            config = load_config(self.config_path)
            self._check_startable(config)
        except (ConfigError, BundleError, OSError) as exc:
            log.error("SIGHUP: keeping the running config: %s", exc)
            return
        log.info("SIGHUP: reloading %s", self.config_path)
        self.stop()
        self._configure(config)
        self.start()

    @staticmethod
    def _check_startable(config: AgentConfig) -> None:
        """Everything a config needs that can fail, checked before the running one is touched:
        the signing and operator keys, the broker's TLS files and secrets, a writable state
        directory. Raises `BundleError`, `ConfigError` or `OSError` naming what is wrong."""
        InstallPolicy.from_config(config)
        for path in config.operator_keys:
            load_public_key(path)
        if config.mqtt is not None:
            MqttLink(config.mqtt, "edge-agent-config-check")  # loads the TLS files, reads the password
        if config.status_page is not None:
            config.status_page.password()
        Store(config.state_dir, config.keep_versions).ensure()
        try:
            atomic_write(config.state_dir / ".writable", b"")
        except OSError as exc:
            raise OSError(f"the state directory {config.state_dir} is not writable: {exc.strerror}") from exc

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- serving -------------------------------------------------------------------------------

    def _serve_current(self) -> None:
        sha = self.store.current_sha()
        if sha is None:
            self.cameras.stop()  # a rollback of the first version: nothing to serve
            return
        if not self.config.pipelines:
            return
        try:
            tuned = self.store.tuning(sha)
            self.cameras.activate(self.store.versions / sha, Tuning.from_json(tuned) if tuned else None)
            self._serving_error = None
        except BundleError as exc:
            self._serving_error = str(exc)
            log.error("cannot serve the current version %s: %s", sha[:12], exc)

    def _on_deployed(self, deployment: Deployment) -> None:
        self._serve_current()
        self._publish_status()

    def _on_succeeded(self, deployment: Deployment) -> None:
        """A new version passed its probation (or had none): its optimisation report, if asked
        for, is measured now (not on probation, where it would take the cameras' CPU)."""
        if self.config.deployments.report:
            self._spawn(lambda: self._publish_report(deployment.sha256), "report")

    def _publish_report(self, sha: str) -> None:
        """The optimisation report of version `sha`, retained on ``<device>/report`` (thread ``report``)."""
        from agent.daemon.report import report_document

        try:
            settings = self.config.runtime_settings()
            frames = self.config.deployments.report_frames
            document = report_document(self.store, sha, self.device, self.board, settings, frames)
        except (BundleError, OSError) as exc:
            log.error("optimisation report of %s: %s", sha[:12], exc)
            return
        if self.link is not None and not self._components_stop.is_set():
            self.link.publish_state(self.topics.report(self.device), json_payload(document))
            log.info("published the optimisation report of %s (%d rows)", sha[:12], len(document["rows"]))

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
            serving_error=self._serving_error,
            deployment=deployment,
            deployment_problem=deployer.problem if deployer is not None else None,
            warnings=(*self.warnings, *self.store.problems),
            cameras=tuple(self.cameras.stats()) if state != "offline" else (),
            broker=self.link.stats() if self.link is not None else None,
            system=self._system,
            events=EventCounts(self.events.published, self.events.suppressed),
            analytics=tuple(self.events.counts()),
            sensors=self._readings,
            governor=self.governing.state if self.governing is not None else None,
            rollout=deployer.rollout if deployer is not None else None,
            runtimes=self._runtimes,
            engine=self.cameras.engine_status(),
        )

    # -- publishing ----------------------------------------------------------------------------

    def _publish_status(self) -> None:
        if self.link is not None:
            document = status_document(self.snapshot())
            self.link.publish_state(self.topics.status(self.device), json_payload(document))

    def _publish_event(self, event: dict[str, object]) -> None:
        self.recent_events.append({k: v for k, v in event.items() if k != "snapshot_jpeg"})  # the page lists, not crops
        if self.link is not None:
            self.link.publish_queued(self.topics.events(self.device), json_payload({"device": self.device, **event}))

    def _sampler_loop(self) -> None:
        """Every telemetry interval: sample the system; with a broker, publish telemetry and the
        status (which keeps the retained fps current for `fleet status`)."""
        while True:
            self._sampler_due = time.monotonic() + self.config.telemetry.interval_s
            if self._components_stop.wait(self.config.telemetry.interval_s):
                break
            self._sample()
            if self.link is not None:
                snapshot = self.snapshot()
                self.link.publish_queued(self.topics.telemetry(self.device), json_payload(telemetry_document(snapshot)))
                self.link.publish_state(self.topics.status(self.device), json_payload(status_document(snapshot)))

    # -- sensors and the governor --------------------------------------------------------------

    def _governing(self, config: AgentConfig) -> Governing:
        """The governor with its fan; a fan that cannot be opened is logged and left out."""
        try:
            fan = open_fan(config.governor.fan, self.sensors.fs, self.pin_factory)
        except FanError as exc:
            log.error("governor: no fan: %s", exc)
            fan = None
        return Governing(config.governor, self.cameras, fan, self._publish_event, self._publish_status)

    def _sample(self) -> None:
        """One tick of the sampler: system and sensor readings, then the governor's step."""
        self._system = self.monitor.sample()
        self._readings = self.sensors.read()
        if self.governing is not None:
            self.governing.step(self._readings)

    # -- commands ------------------------------------------------------------------------------

    def _enqueue_command(self, message: Message) -> None:
        """paho's network thread: refuse at once what must never run, queue the rest."""
        name = message.topic.rsplit("/", 1)[1]
        if message.retain:
            self._throttled.warning("retained", "commands: a retained %s was not run (clear it)", shorten(name))
            return
        reply = message.response_topic
        if reply is not None and not self.topics.is_reply_topic(reply):
            self._throttled.warning(
                "reply",
                "commands: %s not run: it asks to be answered on %s, outside %s/",
                shorten(name),
                shorten(reply),
                self.topics.replies,
            )
            return
        if not self._limits.allow(name):
            self._throttled.warning("rate", "commands: %s requests over the rate limit dropped", shorten(name))
            return
        try:
            self._commands.put_nowait(message)
        except queue.Full:
            self._throttled.warning("full", "commands: the queue is full, %s dropped", shorten(name))

    def _command_loop(self) -> None:
        assert self.link is not None
        commands = {
            "ping": Command(NoArgs, lambda _: {"pong": round(time.time(), 3), "state": self._state}),
            "rollback": Command(NoArgs, self._cmd_rollback),
            "restart-pipeline": Command(PipelineArgs, self._cmd_restart),
            "snapshot": Command(SnapshotArgs, self._cmd_snapshot),
        }
        while (message := self._commands.get()) is not None:
            name = message.topic.rsplit("/", 1)[1]
            response = run_command(commands, name, message.payload, self.gate)
            log.info("command %s: %s", shorten(name), "ok" if response.ok else response.payload.decode()[:200])
            self.link.reply(message, response.payload, response.content_type)

    def _cmd_rollback(self, _: NoArgs) -> dict[str, Any]:
        return asdict(self.rollback())  # a CodedError is answered with its code

    def _cmd_restart(self, args: PipelineArgs) -> dict[str, Any]:
        return {"restarted": self.restart_camera(args.pipeline)}

    def _cmd_snapshot(self, args: SnapshotArgs) -> Response:
        return Response(self.camera_jpeg(args.pipeline, args.quality), "image/jpeg")

    # -- actions (the commands and the status page) ----------------------------------------------

    def rollback(self) -> Deployment:
        """Return to the previous version and serve it: through the deployer when there is one
        (serialised with deployments; a download is cancelled, a probation ends), else on the
        store directly. Raises `CodedError`: ``NO_PREVIOUS``, or ``BUSY`` when a deployment
        step does not end in time."""
        try:
            if self.deployer is not None:
                return self.deployer.request_rollback()
            with self._rollback_lock:
                deployment = rollback(self.store)
                self._serve_current()
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
            raise CodedError(ErrorCode.NO_FRAME, f"pipeline {pipeline.name} has not processed a frame yet")
        return jpeg

    # -- health, systemd and the page -----------------------------------------------------------

    def health(self) -> Health:
        """Whether the cameras' threads, the MQTT link's loop and the sampler turn (any thread)."""
        sampler_stalled_s = max(0.0, time.monotonic() - self._sampler_due) if self._threads else 0.0
        broker = self.link.stats() if self.link is not None else None
        return judge_health(tuple(self.cameras.stats()), broker, sampler_stalled_s, self.config.health.stall_s)

    def service_status(self) -> str:
        """One line for systemd's STATUS=: what is served, the cameras, the broker, the governor."""
        return service_line(self.snapshot())
