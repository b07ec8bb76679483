"""What is wrong with the device, in plain words with what to do: `Finding`s.

Each judge is pure: it takes readings and answers one `Finding` (``pass``, ``warn`` or
``fail``, a message and the fix). The status page lists the findings of `page_problems` (the
failures first) and `edge-agent doctor` runs the same judges on what it reads from a shell,
so a technician reads the same words in both places. Thresholds live here, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from agent.governor.levels import BatteryLevel
from agent.hardware.readings import Battery, Throttled
from agent.mqtt.link import LinkStats, Refused
from agent.mqtt.outbox import OutboxStats
from agent.snapshot import AgentSnapshot, DeploymentStatus, EngineStatus, EnrolmentStatus, Health, MediaUsage
from pipelines.drift import CameraDrift
from pipelines.health_watch import ACTIONS
from pipelines.pipeline import PipelineStats

Status = Literal["pass", "warn", "fail"]

#: the state directory's disk: warn below either, fail below both of the second pair
DISK_WARN_MB, DISK_WARN_FRACTION = 1024.0, 0.10
DISK_FAIL_MB, DISK_FAIL_FRACTION = 200.0, 0.02
#: battery charge in percent, when the governor does not say (its defaults)
BATTERY_LOW_PCT, BATTERY_CRITICAL_PCT = 20.0, 5.0
#: a camera below this fraction of the FPS it reached on the serving version is reported
FPS_RATIO = 0.5
_ORDER = {"fail": 0, "warn": 1, "pass": 2}


@dataclass(frozen=True)
class Finding:
    """One check: `check` names what was looked at (``disk``, ``camera cam0``), `status` the
    verdict, `message` what was found, `fix` what to do about it (empty when nothing)."""

    check: str
    status: Status
    message: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def judge_disk(free_mb: float | None, total_mb: float | None, path: object, read_only: bool | None = False) -> Finding:
    """The free space of the state directory's disk (`path` names it in the message), and whether
    it is mounted read-only."""
    if read_only:
        return Finding(
            "disk",
            "fail",
            f"the disk of {path} is read-only (the kernel remounts an SD card read-only after errors): "
            "deployments are refused, and event snapshots, clips, the outbox and the line totals are not kept; "
            "detection and this page go on",
            "look at the kernel's log (dmesg) for the card's errors, check it (fsck) and reboot; replace a worn card",
        )
    if free_mb is None or not total_mb:
        return Finding("disk", "warn", f"cannot measure the disk of {path}", "check that the state directory exists")
    fraction = free_mb / total_mb
    message = f"{free_mb / 1024:.1f} GiB free of {total_mb / 1024:.1f} GiB ({fraction:.0%}) on the disk of {path}"
    fix = "delete old recordings or logs (journalctl --vacuum-size=100M), or keep fewer versions (keep_versions)"
    if free_mb < DISK_FAIL_MB or fraction < DISK_FAIL_FRACTION:
        return Finding("disk", "fail", f"disk full: {message}; deployments are refused", fix)
    if free_mb < DISK_WARN_MB or fraction < DISK_WARN_FRACTION:
        return Finding("disk", "warn", f"disk almost full: {message}", fix)
    return Finding("disk", "pass", message)


def judge_clock(synchronised: bool | None) -> Finding:
    fix = "enable NTP (timedatectl set-ntp true) and let the device reach a time server (UDP port 123)"
    if synchronised is None:
        return Finding("clock", "warn", "cannot tell whether the clock is synchronised (no timesyncd flag)", fix)
    if not synchronised:
        return Finding(
            "clock",
            "warn",
            "the clock is not synchronised: signed commands are refused once it drifts beyond max_clock_skew_s",
            fix,
        )
    return Finding("clock", "pass", "the clock is synchronised")


def judge_power(throttled: Throttled | None) -> Finding:
    """The Raspberry Pi firmware's under-voltage and throttling flags."""
    supply = "use the official power supply (Pi 4: 5.1 V 3 A, Pi 5: 5.1 V 5 A) with a short cable"
    if throttled is None:
        return Finding("power", "pass", "no under-voltage or throttling flags on this board")
    if throttled.under_voltage:
        return Finding("power", "fail", "under-voltage now: the power supply cannot hold 5 V", supply)
    if throttled.throttled or throttled.arm_frequency_capped or throttled.soft_temp_limit:
        return Finding(
            "power", "warn", "the firmware is throttling the CPU now (heat or power)", "cool the device; " + supply
        )
    if throttled.under_voltage_since_boot or throttled.throttled_since_boot:
        return Finding("power", "warn", "under-voltage or throttling happened since boot (not now)", supply)
    return Finding("power", "pass", "no under-voltage or throttling")


def judge_battery(
    battery: Battery | None,
    level: BatteryLevel | None = None,
    low_pct: float = BATTERY_LOW_PCT,
    critical_pct: float = BATTERY_CRITICAL_PCT,
) -> Finding:
    """The battery's charge: the governor's `level` when it runs (its thresholds and
    hysteresis), else the charge of a discharging battery against `low_pct` / `critical_pct`."""
    if battery is None or battery.percent is None:
        return Finding("battery", "pass", "no battery")
    if level is None:
        low, critical = battery.discharging and battery.percent <= low_pct, battery.percent <= critical_pct
        level = BatteryLevel.CRITICAL if low and critical else BatteryLevel.LOW if low else BatteryLevel.OK
    state = f"battery at {battery.percent:.0f} % ({(battery.status or 'unknown').lower()})"
    fix = "connect power: inference stops when the battery is critical, to protect it"
    if level == BatteryLevel.CRITICAL:
        return Finding("battery", "fail", f"battery critical: {state}; inference is stopped", fix)
    if level == BatteryLevel.LOW:
        return Finding("battery", "warn", f"battery low: {state}; FPS is capped", fix)
    return Finding("battery", "pass", state)


def judge_broker(link: LinkStats | None) -> Finding:
    if link is None:
        return Finding("broker", "pass", "no broker configured: the device runs alone")
    if link.connected:
        return Finding("broker", "pass", f"connected to {link.broker}")
    waiting = f"; {link.queued} message(s) wait to be sent" if link.queued else ""
    return Finding(
        "broker",
        "warn",
        f"broker unreachable ({link.last_error or link.broker}): detections go on locally{waiting}",
        "check the network and mqtt.broker in agent.yaml; edge-agent doctor tests the connection",
    )


def judge_refused(refused: tuple[Refused, ...]) -> Finding:
    """Publishes the broker refused (its PUBACK's failure code), the most refused topic named:
    mostly an ACL that does not let the device write there (`agent.mqtt.link`)."""
    if not refused:
        return Finding("broker acl", "pass", "the broker took every publish")
    top, count = refused[0], sum(r.count for r in refused)
    others = f" and {count - top.count} on {len(refused) - 1} other topic(s)" if len(refused) > 1 else ""
    denied = top.reason.lower() == "not authorized"
    why = "the ACL does not let this device write there" if denied else f"the broker answered {top.reason!r}"
    return Finding(
        "broker acl",
        "fail",
        f"the broker refused {top.count} publish(es) on {top.topic}{others}: {why}; what was published there is lost",
        "rerun edge-agent fleet acl for this device (with --home-assistant PREFIX when Home Assistant is enabled), "
        "install the ACL and reload mosquitto (docs/security.md)",
    )


def judge_outbox(outbox: OutboxStats | None) -> Finding:
    """The durable outbox: its file moved aside or refusing writes, or a backlog older than
    ``outbox.backlog_problem_s`` (with what was dropped; the page's broker panel and /metrics
    show the drops at all times)."""
    if outbox is None:
        return Finding("outbox", "pass", "no broker configured: nothing to send")
    if outbox.problem is not None:
        return Finding("outbox", "fail", outbox.problem, "check the state directory's disk (edge-agent doctor)")
    dropped = outbox.dropped
    lost = f"; dropped so far: {dropped.telemetry} telemetry, {dropped.event} event(s), {dropped.deployment} report(s)"
    if outbox.stuck and outbox.oldest_age_s is not None:
        return Finding(
            "outbox",
            "warn",
            f"{outbox.messages} message(s) wait for the broker, the oldest for {outbox.oldest_age_s:.0f} s"
            + (lost if dropped.total else ""),
            "check the broker connection; the backlog goes out oldest first once it is back",
        )
    return Finding("outbox", "pass", f"{outbox.messages} message(s) waiting")


#: what to do when event media is not kept (the page's words and doctor's)
MEDIA_FIX = (
    "free space on the state directory's disk (edge-agent doctor), or lower events.media.max_mb or "
    "events.media.min_free_mb; detection and events go on without snapshots and clips"
)


def judge_media(media: MediaUsage | None) -> Finding:
    """The events' snapshots and clips: not kept now (the disk under ``events.media.min_free_mb``
    with nothing left to delete, or refusing writes: `MediaUsage.problem`)."""
    if media is None:
        return Finding("media", "pass", "no event snapshots kept (events.snapshots is off)")
    if media.problem is not None:
        return Finding("media", "warn", media.problem, MEDIA_FIX)
    return Finding("media", "pass", f"{media.files} event snapshot(s) and clip(s) kept")


def judge_camera(camera: PipelineStats, reference_fps: float | None) -> Finding:
    """A camera: lost, ended, its model's output unusable (all NaN, or not decodable: a failure
    when no more frames were inferred than that), or slower than it was on this version
    (`reference_fps`); a hung one is the agent's health to say (`page_problems`)."""
    check, source = f"camera {camera.name}", camera.source_status
    if source.state == "reconnecting":
        return Finding(
            check,
            "fail",
            f"camera {camera.name} lost: {source.error or 'no frame'}",
            "check its cable, power or network address; the agent reconnects by itself",
        )
    if source.state == "ended":
        return Finding(check, "warn", f"camera {camera.name}: its video file ended", "set loop: true to replay it")
    if camera.bad_outputs:
        return Finding(
            check,
            "fail" if camera.bad_outputs >= camera.frames else "warn",
            f"camera {camera.name}: the model's output was unusable on {camera.bad_outputs} frame(s) "
            f"({camera.frames} inferred): {camera.bad_output}",
            "roll back below, or use another runtime (runtime: in agent.yaml); a runtime plugin's output is its own",
        )
    if reference_fps and not camera.paused and source.state == "running":
        expected = min(reference_fps, camera.max_fps) if camera.max_fps else reference_fps
        if camera.fps < FPS_RATIO * expected:
            return Finding(
                check,
                "warn",
                f"camera {camera.name} runs at {camera.fps:.1f} FPS, under half the {expected:.1f} FPS it reached "
                "on this version",
                "check the CPU load and the temperature; restart the camera below",
            )
    return Finding(check, "pass", f"camera {camera.name}: {camera.fps:.1f} FPS, {source.state}")


#: camera health problems that leave the camera blind (a failure); the others are warnings
#: (a finding's check is ``camera NAME health``: `edge-agent doctor` picks them from the page's list)
HEALTH_CHECK = "health"
BLIND_KINDS = frozenset({"frozen", "covered"})


def _lasting(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def judge_enrolment(enrolment: EnrolmentStatus, now: float) -> Finding:
    """Where a device started with only a claim stands (agent.daemon.enrol_start): waiting for
    the operator's approval of its request, or refused for good (denied, the claim expired)."""
    since = datetime.fromtimestamp(enrolment.since, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    if enrolment.state != "waiting":
        said = "denied" if enrolment.state == "denied" else "refused: the claim expired"
        fix = "give the device a new claim (edge-agent fleet enrol claim), then restart the service"
        return Finding("enrolment", "fail", f"enrolment {said} (claim {enrolment.claim}): {enrolment.reason}", fix)
    if enrolment.request_id is None:
        asked = f"asking to join the fleet as {enrolment.device_id} with the claim {enrolment.claim}"
    else:
        asked = (
            f"waiting for approval: request {enrolment.request_id} to join as {enrolment.device_id} "
            f"with the claim {enrolment.claim}, since {since}"
        )
    if enrolment.next_retry is not None:
        asked += f"; next try in {_lasting(enrolment.next_retry - now)} ({enrolment.reason})"
    fix = "the operator approves it: edge-agent fleet enrol list; edge-agent fleet enrol approve REQUEST"
    return Finding("enrolment", "warn", f"not enrolled yet, {asked}", fix)


def judge_camera_health(camera: PipelineStats, now: float) -> list[Finding]:
    """A camera's health problems (docs/cameras.md "Camera health"), one finding each: its kind,
    since when (UTC, and for how long at `now`, Unix seconds), the numbers and what to do. None
    while its source is not running (a lost camera is `judge_camera`'s to say)."""
    health = camera.health
    if health is None or camera.source_status.state != "running":
        return []
    found = []
    for problem in health.problems:
        since = datetime.fromtimestamp(problem.since, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        found.append(
            Finding(
                f"camera {camera.name} {HEALTH_CHECK}",
                "fail" if problem.kind in BLIND_KINDS else "warn",
                f"camera {camera.name} {problem.kind.replace('_', ' ')} since {since} "
                f"({_lasting(now - problem.since)}): {problem.detail}",
                ACTIONS[problem.kind],
            )
        )
    return found


#: what to do about a version that did not see what the serving one saw (docs/quality.md)
QUALITY_FIX = (
    "the version before it keeps serving; the deployment's shadow and quality say which camera and class: check "
    "that camera's view (moved, covered, dark), and try the version on its footage with edge-agent bench --against"
)
QUALITY_CODES = frozenset({"SHADOW_DISAGREES", "PROBATION_BLIND"})


def judge_deployment(deployment: DeploymentStatus | None, problem: str | None) -> Finding:
    """The last deployment: a refused document, one that ended without switching or was rolled
    back for a reason (a rollback command's own record has none), or a version that switched
    though its shadow disagreed (``report`` mode)."""
    if problem:
        return Finding("deployment", "warn", f"the last deployment document was refused: {problem}")
    if deployment is None:
        return Finding("deployment", "pass", "last deployment: none")
    what = f"{deployment.name or '?'} {deployment.version or deployment.sha256[:12]}"
    failed = deployment.state in ("FAILED", "REJECTED") or (
        deployment.state == "ROLLED_BACK" and deployment.error is not None
    )
    if failed:
        quality = deployment.error is not None and str(deployment.error.code) in QUALITY_CODES
        return Finding(
            "deployment",
            "warn",
            f"the deployment of {what} ended {deployment.state}: {deployment.error or 'no error recorded'}",
            QUALITY_FIX if quality else "the version before it keeps serving; fix the bundle and push it again",
        )
    shadow = deployment.shadow
    if deployment.state == "SUCCEEDED" and shadow is not None and shadow.outcome == "disagrees":
        return Finding(
            "deployment",
            "warn",
            f"{what} serves though its shadow disagreed with the version before it (report mode): {shadow.message}",
            "watch its events; roll back (edge-agent rollback, or fleet rollback) if it misses what it should see",
        )
    return Finding("deployment", "pass", f"last deployment: {deployment.state}")


def judge_engine(engine: EngineStatus | None) -> Finding:
    """The TensorRT engine build (docs/tensorrt.md): a failed one (it did not build, or its
    engine failed the parity check or the plausibility guard) is a warning, since the version
    serves on ONNX Runtime instead."""
    if engine is None:
        return Finding("engine", "pass", "no TensorRT engine build")
    what = f"the TensorRT {engine.precision} engine of {engine.artifact} ({engine.bundle})"
    if engine.state == "failed":
        return Finding(
            "engine",
            "warn",
            f"{what} is not served: {engine.error_code}: {engine.message}",
            f"{engine.note or 'ONNX Runtime serves instead'}; see docs/tensorrt.md "
            "(edge-agent engine build --force builds it again)",
        )
    if engine.state == "building":
        return Finding("engine", "pass", f"{what} is building ({engine.progress:.0%})")
    return Finding("engine", "pass", f"{what}: {engine.state}")


def judge_hung(problem: str) -> Finding:
    """One of `Health.problems`: a loop that stopped turning."""
    check = problem.split(":")[0] if problem.startswith("camera ") else "health"
    fix = "the watchdog restarts the service; if it happens again, check the camera's driver and cable, and the log"
    return Finding(check, "fail", f"hung: {problem}", fix)


# -- drift (issue 40) ----------------------------------------------------------------------------------

DRIFT_FIX = (
    "look at the camera's picture (moved, dirty, new lighting or layout) and its recent detections; if the scene "
    "really changed, collect frames from this camera for retraining and push a new version (its baseline starts "
    "afresh); docs/cameras.md#drift"
)


def judge_drift(drift: CameraDrift) -> Finding:
    """A camera whose model reports differently from its version's baseline (pipelines.drift):
    a warning from its threshold on, a pass below it or while there is no score yet."""
    check, score = f"drift {drift.camera}", drift.score
    if score is None:
        state = "its baseline is complete" if drift.complete else f"baseline {drift.baseline_s / 3600:.1f} h so far"
        return Finding(check, "pass", f"camera {drift.camera}: no drift score yet ({state})")
    if not drift.drifted:
        return Finding(check, "pass", f"camera {drift.camera}: drift {score.score:.2f}")
    return Finding(
        check,
        "warn",
        f"camera {drift.camera}: drift {score.score:.2f} (threshold {drift.threshold:.2f}) against its version's "
        f"baseline; most changed: {score.changed}",
        DRIFT_FIX,
    )


# -- end of drift --------------------------------------------------------------------------------------


def page_problems(snapshot: AgentSnapshot, health: Health, reference_fps: Mapping[str, float]) -> list[Finding]:
    """Everything wrong with the agent now, failures first; `reference_fps` is the FPS each
    camera reached on the serving version (the page's history measures it)."""
    found = [judge_hung(problem) for problem in health.problems]
    if snapshot.enrolment is not None:  # a device that waits for enrolment runs nothing else yet
        return [*found, judge_enrolment(snapshot.enrolment, snapshot.ts)]
    hung = {f.check for f in found}
    if snapshot.serving_error:
        found.append(Finding("model", "fail", f"the model cannot run: {snapshot.serving_error}", "roll back below"))
    elif snapshot.bundle is None:
        found.append(
            Finding(
                "model",
                "warn",
                "no model is installed: the cameras are not running",
                "push one from the fleet (edge-agent fleet push) or install one (edge-agent install BUNDLE)",
            )
        )
    found += [judge_camera(c, reference_fps.get(c.name)) for c in snapshot.cameras if f"camera {c.name}" not in hung]
    found += [
        f for c in snapshot.cameras if f"camera {c.name}" not in hung for f in judge_camera_health(c, snapshot.ts)
    ]
    governor = snapshot.governor
    if governor is not None and governor.decision.thermal in ("HOT", "CRITICAL"):
        decision = governor.decision
        found.append(
            Finding(
                "temperature",
                "fail" if decision.thermal == "CRITICAL" else "warn",
                f"{decision.thermal}: {decision.reason}",
                "give the device air and shade, and check its fan",
            )
        )
    if governor is not None and governor.fan_error:
        found.append(Finding("fan", "warn", f"the fan cannot be set: {governor.fan_error}", "check governor.fan"))
    sensors, system = snapshot.sensors, snapshot.system
    if sensors is not None:
        found.append(judge_power(sensors.throttled))
        found.append(judge_battery(sensors.battery, governor.decision.battery if governor else None))
    found.append(judge_broker(snapshot.broker))
    found.append(judge_refused(snapshot.broker.refused if snapshot.broker else ()))
    found.append(judge_outbox(snapshot.outbox))
    found.append(judge_media(snapshot.media))
    found.append(judge_deployment(snapshot.deployment, snapshot.deployment_problem))
    found.append(judge_engine(snapshot.engine))
    found += [judge_drift(d) for d in snapshot.drift]  # drift (issue 40)
    if system is not None:
        found.append(
            judge_disk(system.disk_free_mb, system.disk_total_mb, "the state directory", system.disk_read_only)
        )
        found.append(judge_clock(system.clock_synchronised))
    found += [Finding("config", "warn", warning, "see docs/security.md") for warning in snapshot.warnings]
    fix = "update or remove that plugin's package; edge-agent probe lists the plugins (docs/architecture.md)"
    found += [Finding("runtime plugin", "warn", problem, fix) for problem in snapshot.runtime_plugins]
    fix = "name the serving version's labels in cameras[].classes (docs/configuration.md)"
    found += [Finding("config", "warn", problem, fix) for camera in snapshot.thresholds for problem in camera.problems]
    problems = [f for f in found if f.status != "pass"]
    return sorted(problems, key=lambda f: _ORDER[f.status])
