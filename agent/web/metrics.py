"""``GET /metrics``: the agent in Prometheus' text format, through prometheus-client.

`SnapshotCollector` turns one `AgentSnapshot` into metric families at each scrape (no values
are kept between scrapes, no global registry: `metrics_registry` makes the server its own).
Names follow Prometheus' conventions: base units (seconds, bytes, watts, celsius), ``_total``
for counters, one ``camera`` label per camera. The full list is in docs/status-page.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import get_args

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from agent.bundles.record import QualityOutcome, ShadowOutcome, State
from agent.governor.levels import BatteryLevel, ThermalLevel
from agent.mqtt.protocol import PROTOCOL
from agent.snapshot import AgentSnapshot, Health
from pipelines.camera_health import KINDS

Metric = GaugeMetricFamily | CounterMetricFamily | InfoMetricFamily | StateSetMetricFamily


def _gauge(name: str, documentation: str, value: float | None) -> Iterator[GaugeMetricFamily]:
    """One unlabelled gauge, left out while its value is unknown."""
    if value is not None:
        yield GaugeMetricFamily(name, documentation, value=float(value))


class SnapshotCollector(Collector):
    """The metrics of the agent as `snapshot` and `health` read it at scrape time."""

    def __init__(self, snapshot: Callable[[], AgentSnapshot], health: Callable[[], Health]) -> None:
        self._snapshot, self._health = snapshot, health

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot()
        yield from self._agent(snapshot)
        yield from self._cameras(snapshot)
        yield from self._board(snapshot)
        yield from self._broker(snapshot)
        yield from self._drift(snapshot)  # drift (issue 40)

    def _agent(self, s: AgentSnapshot) -> Iterator[Metric]:
        serving = s.serving
        yield InfoMetricFamily(
            "edge_agent",
            "Who this device is and what it serves.",
            value={
                "device": s.device,
                "group": s.group or "",
                "version": s.agent_version,
                "board": s.board.model,
                "runtime": serving.runtime if serving else "",
                "bundle": s.bundle.name if s.bundle else "",
                "bundle_version": s.bundle.version if s.bundle else "",
            },
        )
        yield from self._build(s)
        yield GaugeMetricFamily("edge_agent_healthy", "1 while every loop turns (/healthz 200).", self._health().ok)
        state = s.deployment.state if s.deployment else None
        yield StateSetMetricFamily(
            "edge_agent_deployment_state",
            "The state of the last deployment or rollback.",
            value={member.value: member.value == state for member in State},
        )
        yield from self._quality(s)
        yield CounterMetricFamily("edge_agent_events_published", "Object events published.", s.events.published)
        if s.media is not None:
            yield GaugeMetricFamily("edge_agent_media_bytes", "Event snapshots kept on disk.", s.media.bytes)
            yield GaugeMetricFamily("edge_agent_media_files", "Event snapshots kept on disk.", s.media.files)
            yield CounterMetricFamily(
                "edge_agent_clips_written", "Clips around object events written.", s.media.clips_written
            )
            yield CounterMetricFamily(
                "edge_agent_clips_dropped",
                "Clips dropped (writer behind, too many at once, disk).",
                s.media.clips_dropped,
            )
        yield CounterMetricFamily(
            "edge_agent_events_suppressed", "Object updates held back by events.min_interval_s.", s.events.suppressed
        )
        yield CounterMetricFamily(
            "edge_agent_classifications", "The second stage's crops classified.", s.events.classified
        )
        yield CounterMetricFamily(
            "edge_agent_classifications_dropped",
            "The second stage's crops dropped, its queue full (the oldest each time).",
            s.events.classify_dropped,
        )
        yield from self._analytics(s)

    def _build(self, s: AgentSnapshot) -> Iterator[Metric]:
        """``edge_agent_build_info{version, protocol} 1``: the build, as Prometheus' convention
        names it, so a query can count the fleet by version (docs/fleet.md#versions)."""
        yield InfoMetricFamily(
            "edge_agent_build",
            "The agent's version and the newest control protocol it reads.",
            value={"version": s.agent_version, "protocol": str(PROTOCOL)},
        )

    def _quality(self, s: AgentSnapshot) -> Iterator[Metric]:
        """What the last deployment's shadow and probation quality check judged (docs/quality.md),
        while the record carries them; a ratio not judged (a quiet camera) is left out."""
        shadow = s.deployment.shadow if s.deployment else None
        if shadow is not None:
            yield StateSetMetricFamily(
                "edge_agent_shadow_outcome",
                "The last shadow's outcome (the candidate against the serving version, before the switch).",
                value={outcome: outcome == shadow.outcome for outcome in get_args(ShadowOutcome)},
            )
            yield GaugeMetricFamily(
                "edge_agent_shadow_min_agreement", "The agreement the last shadow held the candidate to.",
                shadow.min_agreement,
            )  # fmt: skip
            agreement = GaugeMetricFamily(
                "edge_agent_shadow_agreement",
                "The last shadow's agreement (F1 of the candidate against the serving version).",
                labels=["camera"],
            )
            frames = GaugeMetricFamily(
                "edge_agent_shadow_frames", "Frames the last shadow compared.", labels=["camera"]
            )
            top1 = GaugeMetricFamily(
                "edge_agent_shadow_top1_agreement",
                "The last shadow's second-stage top-1 agreement (crops both classifiers named alike).",
                labels=["camera"],
            )
            for camera in shadow.cameras:
                agreement.add_metric([camera.camera], camera.agreement)
                frames.add_metric([camera.camera], camera.frames)
                if camera.top1 is not None:
                    top1.add_metric([camera.camera], camera.top1)
            yield from (agreement, frames, top1)
        quality = s.deployment.quality if s.deployment else None
        if quality is not None:
            yield StateSetMetricFamily(
                "edge_agent_probation_quality_outcome",
                "The last probation's quality outcome (the new version against the previous, after the switch).",
                value={outcome: outcome == quality.outcome for outcome in get_args(QualityOutcome)},
            )
            yield GaugeMetricFamily(
                "edge_agent_probation_quality_min_ratio", "The ratio the last probation held the new version to.",
                quality.min_ratio,
            )  # fmt: skip
            ratio = GaugeMetricFamily(
                "edge_agent_probation_quality_ratio",
                "Confident detections per frame of the new version over the previous one's, on probation.",
                labels=["camera"],
            )
            for rates in quality.cameras:
                if rates.ratio is not None:
                    ratio.add_metric([rates.camera], rates.ratio)
            yield ratio
            if quality.agreement is not None:
                agreement = GaugeMetricFamily(
                    "edge_agent_probation_agreement",
                    "On probation, the new version's agreement with the previous one run beside it (F1, same frames).",
                    labels=["camera"],
                )
                for camera in quality.agreement.cameras:
                    agreement.add_metric([camera.camera], camera.agreement)
                yield agreement

    def _analytics(self, s: AgentSnapshot) -> Iterator[Metric]:
        """Line crossings and zone occupancy per camera (docs/analytics.md)."""
        crossings = CounterMetricFamily(
            "edge_agent_line_crossings", "Objects that crossed a counting line.", labels=["camera", "line", "direction"]
        )
        inside = GaugeMetricFamily(
            "edge_agent_zone_objects", "Tracked objects inside a zone now.", labels=["camera", "zone"]
        )
        entered = CounterMetricFamily(
            "edge_agent_zone_entries", "Objects that entered a zone.", labels=["camera", "zone"]
        )
        for camera in s.analytics:
            for line in camera.lines:
                crossings.add_metric([camera.camera, line.name, "in"], line.forward)
                crossings.add_metric([camera.camera, line.name, "out"], line.backward)
            for zone in camera.zones:
                inside.add_metric([camera.camera, zone.name], zone.now)
                entered.add_metric([camera.camera, zone.name], zone.total)
        yield from (crossings, inside, entered)

    def _cameras(self, s: AgentSnapshot) -> Iterator[Metric]:
        fps = GaugeMetricFamily("edge_agent_camera_fps", "Frames inferred per second.", labels=["camera"])
        latency = GaugeMetricFamily(
            "edge_agent_camera_latency_seconds",
            "Latency per stage over the last frames (quantile 0.5 and 0.95).",
            labels=["camera", "stage", "quantile"],
        )
        frames = CounterMetricFamily("edge_agent_camera_frames", "Frames inferred.", labels=["camera"])
        dropped = CounterMetricFamily(
            "edge_agent_camera_dropped", "Frames replaced before inference.", labels=["camera"]
        )
        errors = CounterMetricFamily("edge_agent_camera_errors", "Frames whose inference failed.", labels=["camera"])
        up = GaugeMetricFamily("edge_agent_camera_source_up", "1 while the camera delivers frames.", labels=["camera"])
        stalled = GaugeMetricFamily(
            "edge_agent_camera_stalled_seconds", "How long a camera thread is past its turn.", labels=["camera"]
        )
        shared_by = GaugeMetricFamily(
            "edge_agent_camera_model_shared_by", "Cameras on this camera's model (1: its own).", labels=["camera"]
        )
        batch = GaugeMetricFamily(
            "edge_agent_camera_mean_batch", "Frames per inference call on this camera's model.", labels=["camera"]
        )
        in_view = GaugeMetricFamily(
            "edge_agent_camera_objects_in_view", "Objects of a label in the newest frame.", labels=["camera", "label"]
        )
        for camera in s.cameras:
            name = [camera.name]
            for label, count in camera.in_view.items():
                in_view.add_metric([camera.name, label], count)
            shared_by.add_metric(name, camera.shared_by)
            batch.add_metric(name, camera.mean_batch)
            fps.add_metric(name, camera.fps)
            for stage, p in camera.latency_ms.items():
                latency.add_metric([camera.name, stage, "0.5"], p.p50 / 1000)
                latency.add_metric([camera.name, stage, "0.95"], p.p95 / 1000)
            frames.add_metric(name, camera.frames)
            dropped.add_metric(name, camera.dropped)
            errors.add_metric(name, camera.errors)
            up.add_metric(name, camera.source_status.state == "running")
            stalled.add_metric(name, camera.stalled_s)
        yield from (fps, latency, frames, dropped, errors, up, stalled, shared_by, batch, in_view)
        yield from self._camera_health(s)

    def _camera_health(self, s: AgentSnapshot) -> Iterator[Metric]:
        """Each checked camera's health problems (docs/cameras.md "Camera health"): 1 for each
        kind it has now, 0 for the others; no series for a camera without the check, nor while its
        source is not running (its last picture is stale: `edge_agent_camera_source_up` says)."""
        problem = GaugeMetricFamily(
            "edge_agent_camera_problem",
            "1 while the camera's picture has this problem (frozen, dark, covered, moved, ...).",
            labels=["camera", "kind"],
        )
        for camera in s.cameras:
            if camera.health is not None and camera.source_status.state == "running":
                kinds = set(camera.health.kinds)
                for kind in KINDS:
                    problem.add_metric([camera.name, kind], kind in kinds)
        yield problem

    # -- drift (issue 40) ----------------------------------------------------------------------

    def _drift(self, s: AgentSnapshot) -> Iterator[Metric]:
        """Each camera's drift score, where it has one (pipelines.drift; docs/cameras.md#drift)."""
        score = GaugeMetricFamily(
            "edge_agent_drift_score",
            "What the camera's model reports against its version's baseline, 0 (the same) to 1.",
            labels=["camera"],
        )
        for drift in s.drift:
            if drift.score is not None:
                score.add_metric([drift.camera], drift.score.score)
        yield score

    # -- end of drift ----------------------------------------------------------------------------

    def _board(self, s: AgentSnapshot) -> Iterator[Metric]:
        sensors, system, governor = s.sensors, s.system, s.governor
        if s.energy is not None:
            yield CounterMetricFamily(
                "edge_agent_energy_joules",
                "The board's input energy since the agent started (power integrated, trapezoid rule).",
                s.energy.joules,
            )
        if sensors is not None:
            zones = GaugeMetricFamily("edge_agent_temperature_celsius", "Each thermal zone.", labels=["zone"])
            for zone in sensors.thermal_zones:
                if zone.temp_c is not None:
                    zones.add_metric([zone.name], zone.temp_c)
            yield zones
            yield from _gauge("edge_agent_temperature_max_celsius", "The hottest temperature known.", sensors.temp_c)
            yield from _gauge("edge_agent_power_watts", "The board's input power.", sensors.power_w)
            rails = GaugeMetricFamily("edge_agent_rail_power_watts", "Each measured power rail.", labels=["rail"])
            for rail in sensors.rails:
                if rail.power_w is not None:
                    rails.add_metric([rail.name], rail.power_w)
            yield rails
            battery = sensors.battery.percent if sensors.battery else None
            yield from _gauge("edge_agent_battery_percent", "Battery charge.", battery)
            if sensors.throttled is not None:
                yield GaugeMetricFamily(
                    "edge_agent_under_voltage",
                    "1 while the firmware reports under-voltage.",
                    sensors.throttled.under_voltage,
                )
        if governor is not None:
            decision = governor.decision
            yield StateSetMetricFamily(
                "edge_agent_governor_thermal",
                "The governor's thermal level.",
                value={level.value: level == decision.thermal for level in ThermalLevel},
            )
            yield StateSetMetricFamily(
                "edge_agent_governor_battery",
                "The governor's battery level.",
                value={level.value: level == decision.battery for level in BatteryLevel},
            )
            yield from _gauge("edge_agent_governor_fps_cap", "The FPS cap in force.", decision.actions.fps_cap)
            yield from _gauge(
                "edge_agent_governor_gate_slowdown",
                "How many times longer the motion gates' idle interval and keepalive period are.",
                decision.actions.gate_slowdown,
            )
            if decision.thresholds is not None:
                starts = GaugeMetricFamily(
                    "edge_agent_governor_threshold_celsius",
                    "The temperature at which each thermal level begins.",
                    labels=["level"],
                )
                for level in (ThermalLevel.WARM, ThermalLevel.HOT, ThermalLevel.CRITICAL):
                    starts.add_metric([level.value], decision.thresholds.start_of(level))
                yield starts
        if system is not None:
            yield GaugeMetricFamily("edge_agent_cpu_percent", "CPU use of the machine, all cores.", system.cpu_percent)
            yield GaugeMetricFamily("edge_agent_process_rss_bytes", "Resident memory.", system.process_rss_mb * 2**20)
            free = system.disk_free_mb * 2**20 if system.disk_free_mb is not None else None
            yield from _gauge("edge_agent_disk_free_bytes", "Free space of the state directory's disk.", free)
            size = system.disk_total_mb * 2**20 if system.disk_total_mb is not None else None
            yield from _gauge("edge_agent_disk_size_bytes", "Size of the state directory's disk.", size)
            synced = system.clock_synchronised
            yield from _gauge("edge_agent_clock_synchronised", "1 when NTP synchronised the clock.", synced)

    def _broker(self, s: AgentSnapshot) -> Iterator[Metric]:
        broker = s.broker
        if broker is None:
            return
        yield GaugeMetricFamily("edge_agent_broker_connected", "1 while connected to the broker.", broker.connected)
        yield GaugeMetricFamily("edge_agent_mqtt_queued_messages", "Messages waiting for the broker.", broker.queued)
        yield CounterMetricFamily("edge_agent_mqtt_dropped_messages", "Queued messages dropped.", broker.dropped)
        yield CounterMetricFamily("edge_agent_mqtt_reconnects", "Lost broker connections.", broker.reconnects)
        yield from self._outbox(s)

    def _outbox(self, s: AgentSnapshot) -> Iterator[Metric]:
        outbox = s.outbox
        if outbox is None:
            return
        yield GaugeMetricFamily(
            "edge_agent_outbox_messages", "Messages in the outbox, not yet acknowledged.", outbox.messages
        )
        yield GaugeMetricFamily("edge_agent_outbox_bytes", "The outbox file's size with its WAL.", outbox.bytes)
        yield from _gauge(
            "edge_agent_outbox_oldest_age_seconds", "Age of the oldest message in the outbox.", outbox.oldest_age_s
        )
        dropped = CounterMetricFamily(
            "edge_agent_outbox_dropped_messages",
            "Messages the outbox let go of unsent (full, expired, unwritten, too big, refused), by kind.",
            labels=["kind"],
        )
        for kind in ("telemetry", "event", "deployment"):
            dropped.add_metric([kind], getattr(outbox.dropped, kind))
        yield dropped
        yield CounterMetricFamily(
            "edge_agent_outbox_recreated",
            "Times the outbox file was deleted or replaced under the agent and made again (this run).",
            outbox.recreated,
        )


def metrics_registry(snapshot: Callable[[], AgentSnapshot], health: Callable[[], Health]) -> CollectorRegistry:
    """A registry of its own holding the agent's collector (prometheus-client's default one is
    process-global)."""
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(snapshot, health))
    return registry
