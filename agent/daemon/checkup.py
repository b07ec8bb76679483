"""``edge-agent doctor``: the status page's checks, run from a shell on the device.

Each check answers a `Finding` (pass, warn or fail, with the fix), judged by the same functions
as the page's problem list (`agent.web.problems`), so a technician reads the same words in both:

config valid -> state directory writable and disk free -> trusted and operator keys readable ->
(without a broker but with a claim) enrolment refused, waiting or not begun ->
broker reachable with the configured TLS and credentials -> its ACL takes what the device
publishes (with Home Assistant enabled: a probe on its discovery and frame topics) -> the
outbox's backlog (messages, the oldest's age, dropped; read only) -> the event snapshots kept
(with events.snapshots) -> each camera opens and delivers a frame (a pipe source this device
lacks the programs or GStreamer elements for fails with what to install, unopened:
`agent.hardware.camera_tools.source_problems`, the check ``config check`` and the daemon's start
share) -> a runtime loads the active version -> sensors readable (power, battery) -> clock
synchronised -> the running agent's ``/healthz`` and its cameras' health problems (frozen, dark,
covered, moved, ...: its page's problem list; when the page is configured).

`check_startable` is the daemon's own check of a config before a SIGHUP applies it.

A config that cannot be read stops the list there. Slow checks (the broker, a camera) give up
after `timeout_s`; a camera read that never returns is left to its daemon thread. Runs in the
caller's thread, opens what the daemon would open: a camera the daemon holds may be busy, and
a broker that ties client ids to user names disconnects the daemon for a moment.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import sqlite3
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil

from agent.bundles.installer import InstallPolicy
from agent.bundles.signing import load_public_key
from agent.bundles.store import Store
from agent.config.loading import check_files, load_config, security_warnings
from agent.config.models import AgentConfig, CameraSection, StatusPageSection
from agent.daemon.enrol_start import Refusal, claim_to_use
from agent.daemon.media import FOLDER as MEDIA_FOLDER
from agent.daemon.media import disk_free, usage_of
from agent.errors import BundleError, ConfigError
from agent.hardware.board import probe
from agent.hardware.camera_tools import CameraTools, find_camera_tools, source_problems
from agent.hardware.clock import clock_synchronised
from agent.hardware.sensors import Sensors
from agent.hardware.sysfs import SysFS
from agent.mqtt.enrol_device import PENDING
from agent.mqtt.home_assistant import slug
from agent.mqtt.link import Delivery, MqttLink
from agent.mqtt.outbox import FILE_NAME as OUTBOX_FILE
from agent.mqtt.outbox import MIB, peek
from agent.mqtt.protocol import Topics
from agent.serving.cameras import pipe_settings, source_for
from agent.serving.loader import open_detector
from agent.snapshot import MediaUsage
from agent.web.problems import (
    HEALTH_CHECK,
    MEDIA_FIX,
    Finding,
    judge_battery,
    judge_clock,
    judge_disk,
    judge_outbox,
    judge_power,
    judge_refused,
)
from pipelines.sources.frames import SourceError, redact_credentials
from pipelines.sources.pipe_commands import PipeSettings, pipe_tool
from pipelines.worker import Worker
from runtimes.files import atomic_write


def check_startable(config: AgentConfig) -> None:
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
    Store(config.state_dir, config.keep_versions, config.runtime_settings()).ensure()
    try:
        atomic_write(config.state_dir / ".writable", b"")
    except OSError as exc:
        raise OSError(f"the state directory {config.state_dir} is not writable: {exc.strerror}") from exc


def reloadable(path: Path) -> AgentConfig:
    """The config at `path` if a SIGHUP may apply it: it loads, `check_startable` passes and
    ``edge-agent config check`` finds no problem in its files (a missing video file or key).
    Raises `ConfigError`, `BundleError` or `OSError` naming what is wrong; the running config
    is left alone."""
    config = load_config(path)
    check_startable(config)
    if problems := check_files(config):
        raise ConfigError(f"{'; '.join(problems)} (edge-agent config check {path})")
    return config


def run_checks(config_path: Path, root: Path = Path("/"), timeout_s: float = 10.0) -> list[Finding]:
    """Every check, in order; `root` is where the board and the sensors are read (fake trees)."""
    fix = f"edge-agent config check {config_path} lists every problem with its line"
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        return [Finding("config", "fail", str(exc), fix)]
    problems = check_files(config)
    found = [Finding("config", "fail", f"{config_path}: {problem}", fix) for problem in problems]
    found = found or [Finding("config", "pass", f"{config_path} is valid")]
    found += [Finding("config", "warn", note, "rename it (docs/changelog.md)") for note in config.deprecations]
    found += [Finding("config", "warn", warning, "see docs/security.md") for warning in security_warnings(config)]
    found += [check_state_dir(config), check_keys(config)]
    if (enrolment := check_enrolment(config)) is not None:
        found.append(enrolment)
    if config.mqtt is not None:
        found += check_broker(config, timeout_s)
        found.append(check_outbox(config))
    if config.events.snapshots or any(p.clips is not None for p in config.cameras):
        found.append(check_media(config))
    found += check_cameras(config, root, timeout_s)
    found.append(check_runtime(config, root))
    found += check_sensors(config, root)
    found.append(judge_clock(clock_synchronised(SysFS(root))))
    if config.status_page is not None:
        found.append(check_running_agent(config.status_page))
        found += check_camera_health(config.status_page)
    return found


def check_enrolment(config: AgentConfig) -> Finding | None:
    """Where a device without a broker stands with its claim (docs/fleet.md#enrolment); None
    when it has a broker or no claim."""
    claim = claim_to_use(config)
    if claim is None:
        return None
    refused = Refusal.read(config.state_dir)
    if refused is not None:
        fix = f"give the device a new claim (edge-agent fleet enrol claim) in place of {claim}, then start it"
        return Finding("enrolment", "fail", f"enrolment refused for the claim {refused.claim}: {refused}", fix)
    pending = config.state_dir / "enrol" / PENDING
    if pending.exists():
        words = f"waiting for the operator to approve its request ({pending}) with the claim {claim}"
        return Finding("enrolment", "warn", words, "edge-agent fleet enrol list; edge-agent fleet enrol approve ID")
    return Finding("enrolment", "warn", f"not enrolled yet: edge-agent run enrols with {claim}", "start the service")


def check_state_dir(config: AgentConfig) -> Finding:
    folder = config.state_dir
    if not folder.is_dir():
        return Finding("state", "warn", f"the state directory {folder} does not exist yet", "the service creates it")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".doctor-"):
            pass
    except OSError as exc:
        if exc.errno == errno.EROFS:
            return replace(judge_disk(None, None, folder, read_only=True), check="state")
        return Finding(
            "state",
            "fail",
            f"cannot write to the state directory {folder}: {exc.strerror}",
            f"chown -R edge-agent: {folder} (or run the doctor as the user the agent runs as)",
        )
    usage = psutil.disk_usage(str(folder))
    disk = judge_disk(usage.free / 2**20, usage.total / 2**20, folder)
    return disk if disk.status != "pass" else Finding("state", "pass", f"{folder} is writable; {disk.message}")


def check_outbox(config: AgentConfig) -> Finding:
    """The backlog in the outbox file (read only, beside the running agent): messages, the
    oldest's age, what was dropped; a file SQLite cannot read fails."""
    path = config.state_dir / OUTBOX_FILE
    try:
        stats = peek(path, config.outbox, time.time())
    except sqlite3.Error as exc:
        return Finding("outbox", "fail", f"{path} cannot be read ({exc})", "the agent moves it aside when it starts")
    if stats is None:
        return Finding("outbox", "pass", f"no outbox yet ({path}): the agent makes it when it starts")
    finding = judge_outbox(stats)
    if finding.status != "pass":
        return finding
    age = f", the oldest {stats.oldest_age_s:.0f} s old" if stats.oldest_age_s is not None else ""
    dropped = stats.dropped
    return Finding(
        "outbox",
        "pass",
        f"{stats.messages} message(s) waiting{age}; {stats.bytes / MIB:.1f} of {config.outbox.max_mb:g} MiB; "
        f"dropped {dropped.telemetry} telemetry, {dropped.event} event(s), {dropped.deployment} report(s)",
    )


def check_media(config: AgentConfig, free_bytes: Callable[[Path], int] = disk_free) -> Finding:
    """The events' snapshots and clips kept (read only): files, their size against
    ``events.media.max_mb``; a warning while the disk is under ``events.media.min_free_mb`` (the
    agent deletes the oldest and keeps no new one while it lacks the room; `free_bytes` reads the
    free space, injected in tests)."""
    folder = config.state_dir / MEDIA_FOLDER
    usage = usage_of(folder, time.time()) if folder.is_dir() else MediaUsage(0, 0, None)
    age = f", the oldest {usage.oldest_age_s / 3600:.1f} h old" if usage.oldest_age_s is not None else ""
    kept = (
        f"{usage.files} event snapshot(s) and clip(s) kept, "
        f"{usage.bytes / MIB:.1f} of {config.events.media.max_mb:g} MiB{age}"
    )
    floor = config.events.media.min_free_mb
    try:
        free = free_bytes(folder if folder.is_dir() else config.state_dir) if floor > 0 else None
    except OSError:
        free = None  # no state directory yet: check_state_dir says so
    if free is not None and free < floor * MIB:
        return Finding(
            "media",
            "warn",
            f"the disk of the media folder {folder} has {free / MIB:.0f} MiB free, less than "
            f"events.media.min_free_mb ({floor:g}): the oldest snapshots and clips are deleted and new ones "
            f"not kept while it lacks the room; {kept}",
            MEDIA_FIX,
        )
    return Finding("media", "pass", kept)


def check_keys(config: AgentConfig) -> Finding:
    keys = [("trust_keys", path) for path in config.trust_keys] + [("operator_keys", p) for p in config.operator_keys]
    for where, path in keys:
        try:
            load_public_key(path)
        except (BundleError, OSError) as exc:
            return Finding("keys", "fail", f"{where}: {exc}", "copy the public key there (edge-agent keygen made it)")
    if not keys:
        return Finding("keys", "warn", "no trusted or operator key configured", "see docs/security.md")
    return Finding(
        "keys", "pass", f"{len(config.trust_keys)} trusted and {len(config.operator_keys)} operator key(s) readable"
    )


def check_broker(config: AgentConfig, timeout_s: float) -> list[Finding]:
    """One connection with the configured TLS and credentials, under a client id of its own;
    once connected, the ACL's verdict on `acl_probes` (`judge_refused`, the page's words)."""
    assert config.mqtt is not None
    broker = config.mqtt.broker
    fix = "check the network, mqtt.broker, the credentials and mqtt.tls in agent.yaml"
    try:
        link = MqttLink(config.mqtt, f"edge-agent-doctor-{config.device_id()}-{os.getpid()}")
    except ConfigError as exc:
        return [Finding("broker", "fail", str(exc), fix)]
    link.start()
    acl = None
    try:
        connected = link.wait_attempted(timeout_s) and link.wait_connected(0.5)
        error = link.last_error
        if connected and (probes := acl_probes(config)):
            deliveries = [link.publish(topic, b"", qos=1) for topic in probes]
            deadline = time.monotonic() + timeout_s
            if all(isinstance(d, Delivery) and d.wait(max(0.0, deadline - time.monotonic())) for d in deliveries):
                acl = judge_refused(link.refused())
    finally:
        link.stop()
    if connected:
        found = [Finding("broker", "pass", f"connected to {broker}" + (" with TLS" if config.mqtt.uses_tls else ""))]
        return found + ([acl] if acl is not None else [])
    return [Finding("broker", "fail", error or f"no answer from {broker} within {timeout_s:.0f} s", fix)]


#: the object id and camera name of the ACL probes: no entity or camera is named so (nothing reads them)
ACL_PROBE = "edge_agent_acl_probe"


def acl_probes(config: AgentConfig) -> list[str]:
    """Topics the device must be allowed to write and that nobody reads, one for each kind of
    rule the integrations need (empty, not retained, QoS 1: the broker's PUBACK says whether its
    ACL took it): with Home Assistant, a discovery config of an entity that does not exist (an
    empty config removes nothing) and a frame of a camera that does not exist."""
    assert config.mqtt is not None
    settings, device = config.integrations.home_assistant, config.device_id()
    if not settings.enabled:
        return []
    topics = Topics(config.mqtt.topic_root)
    return [
        f"{settings.discovery_prefix}/sensor/{slug(device)}/{ACL_PROBE}/config",
        topics.device(device, f"ha/{ACL_PROBE}/image"),
    ]


def check_cameras(
    config: AgentConfig, root: Path, timeout_s: float, find_tools: Callable[[], CameraTools] = find_camera_tools
) -> list[Finding]:
    """Each camera: a pipe source this device cannot run fails with what to install (the tools
    are asked only when a camera is a pipe source); the others are opened (`check_camera`)."""
    tools = find_tools() if any(pipe_tool(s.source) for s in config.cameras) else None
    pipe = pipe_settings(config.serving, probe(root), tools)
    found = []
    for section in config.cameras:
        problems = source_problems(section.source, tools) if tools else []
        if problems:
            fix = "install what is named, or change cameras[].source (docs/cameras.md has each board's recipe)"
            found.append(Finding(f"camera {section.name}", "fail", "; ".join(problems), fix))
        else:
            found.append(check_camera(section, timeout_s, pipe))
    return found


def check_camera(section: CameraSection, timeout_s: float, pipe: PipeSettings | None = None) -> Finding:
    """Open the camera and read one frame, within `timeout_s`; `pipe`: how pipe sources run."""
    name, result = f"camera {section.name}", dict[str, Any]()

    def read() -> None:
        source = source_for(section, pipe)
        try:
            source.open()
            frame = source.read()
            result["shape"] = None if frame is None else frame.image.shape
        except SourceError as exc:
            result["error"] = str(exc)
        except Exception as exc:  # a driver's own error: report it, as the daemon would
            result["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            source.close()

    reader = Worker.once(f"doctor-{section.name}", read, described=f"camera {section.name}'s first frame")
    reader.start().join(timeout_s)  # a camera that never answers is left behind: the check says so
    fix = "check its cable, power or address (cameras[].source); a running agent may hold it: stop it first"
    shown = redact_credentials(section.source)
    if "error" in result:
        return Finding(name, "fail", redact_credentials(str(result["error"])), fix)
    if "shape" not in result:
        return Finding(name, "fail", f"no frame within {timeout_s:.0f} s from {shown}", fix)
    if result["shape"] is None:
        return Finding(name, "warn", f"{shown} has no frame (an empty file?)", fix)
    height, width = result["shape"][:2]
    return Finding(name, "pass", f"a {width}x{height} frame from {shown}")


def check_runtime(config: AgentConfig, root: Path) -> Finding:
    """Load the active version as the cameras would, then close it."""
    store = Store(config.state_dir, config.keep_versions, config.runtime_settings())
    sha = store.current_sha()
    info = store.info(sha)
    if sha is None or info is None:
        fix = "push a bundle (edge-agent fleet push) or install one (edge-agent install BUNDLE)"
        return Finding("runtime", "warn", "no version is installed: the cameras do not run", fix)
    try:
        loaded = open_detector(store.versions / sha, probe(root), config.runtime, 1, config.runtimes)
    except BundleError as exc:
        return Finding(
            "runtime", "fail", f"{info.name} {info.version} does not load: {exc}", "roll back: edge-agent rollback"
        )
    loaded.detector.runtime.close()
    choice = loaded.choice
    return Finding("runtime", "pass", f"{info.name} {info.version} loads on {choice.runtime} ({choice.reason})")


def check_sensors(config: AgentConfig, root: Path) -> list[Finding]:
    sensors = Sensors.from_config(config.sensors, root)
    try:
        readings = sensors.read()
    finally:
        sensors.close()
    if readings.temp_c is None:
        found = Finding(
            "sensors",
            "warn",
            "no temperature can be read: the governor cannot protect the board",
            "on a device, check that /sys/class/thermal has zones the agent's user may read (a VM has none)",
        )
    else:
        power = f", {readings.power_w:.1f} W" if readings.power_w is not None else ""
        found = Finding("sensors", "pass", f"{readings.temp_c:.1f} °C{power} ({', '.join(readings.sources)})")
    battery = config.governor.battery
    return [
        found,
        judge_power(readings.throttled),
        judge_battery(readings.battery, None, battery.low_pct, battery.critical_pct),
    ]


def _agent_url(page: StatusPageSection, path: str) -> tuple[str, ssl.SSLContext | None]:
    """The running agent's page at `path` on this device, and the TLS context to reach it."""
    host = "127.0.0.1" if page.host in ("0.0.0.0", "localhost") else "[::1]" if page.host == "::" else page.host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"{'https' if page.tls else 'http'}://{host}:{page.port}{path}"
    context = None
    if page.tls:  # our own certificate, on this device: its name need not be 127.0.0.1
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return url, context


#: the most bytes of the running agent's problem list read
MAX_PROBLEMS_BYTES = 1024 * 1024


def check_camera_health(page: StatusPageSection, timeout_s: float = 5.0) -> list[Finding]:
    """The running agent's camera health problems (frozen, dark, covered, moved, ...), from its
    page's problem list (``/api/problems``, with the page's credentials), the page's words. None
    when no agent answers (`check_running_agent` says so) or its answer is not a problem list."""
    url, context = _agent_url(page, "/api/problems")
    request = urllib.request.Request(url)
    try:
        password = page.password()
    except ConfigError:  # the config's check says which file or variable is missing
        return []
    if page.username is not None and password is not None:
        token = base64.b64encode(f"{page.username}:{password}".encode()).decode("ascii")
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            body = response.read(MAX_PROBLEMS_BYTES + 1)
        listed = json.loads(body) if len(body) <= MAX_PROBLEMS_BYTES else {}
    except (OSError, ValueError):
        return []
    found = []
    for item in listed.get("problems", []) if isinstance(listed, dict) else []:
        try:
            finding = Finding(**item)
        except TypeError:
            continue
        if finding.check.startswith("camera ") and finding.check.endswith(f" {HEALTH_CHECK}"):
            found.append(finding)
    return found


def check_running_agent(page: StatusPageSection, timeout_s: float = 5.0) -> Finding:
    """The running agent's own verdict, from its ``/healthz`` on this device."""
    url, context = _agent_url(page, "/healthz")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as response:
            response.read()
        return Finding("agent", "pass", f"the running agent answers healthy on {url}")
    except urllib.error.HTTPError as exc:
        return Finding(
            "agent", "fail", f"the running agent is hung: {exc.read().decode(errors='replace')[:300]}", "see its log"
        )
    except OSError as exc:
        return Finding(
            "agent",
            "warn",
            f"no agent answers on {url} ({exc})",
            "systemctl status edge-agent; journalctl -u edge-agent",
        )
