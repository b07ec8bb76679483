"""`agent.web.metrics`: a snapshot with every part present, scraped from its registry and parsed
with prometheus-client's own parser: names, labels, base units; unknown values left out."""

from __future__ import annotations

import dataclasses

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from testkit.quality_records import quality, rate_camera, shadow, shadow_camera
from testkit.snapshots import full_snapshot, snapshot

from agent.bundles.record import State
from agent.hardware.energy import Energy
from agent.mqtt.protocol import PROTOCOL
from agent.snapshot import DeploymentStatus, Health
from agent.web.metrics import metrics_registry


def _scrape(snap, healthy: bool = True) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics_registry(lambda: snap, lambda: Health(healthy))).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _labels(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def test_every_part_of_the_snapshot_in_base_units() -> None:
    full = full_snapshot()
    got = _scrape(full)
    cam0, cam1 = (("camera", "cam0"),), (("camera", "cam1"),)
    assert got[("edge_agent_camera_fps", cam0)] == 10.0
    assert got[("edge_agent_camera_dropped_total", cam1)] == 3
    assert got[("edge_agent_camera_model_shared_by", cam0)] == 2
    assert got[("edge_agent_camera_mean_batch", cam0)] == 1.5
    in_view = {dict(labels)["label"]: value for (name, labels), value in got.items()
               if name == "edge_agent_camera_objects_in_view" and dict(labels)["camera"] == "cam0"}  # fmt: skip
    assert in_view == {"person": 2, "car": 1}
    assert not any(name == "edge_agent_camera_objects_in_view" and ("camera", "cam1") in labels
                   for name, labels in got), "a camera that sees nothing has no series"  # fmt: skip
    latency = (("camera", "cam0"), ("quantile", "0.95"), ("stage", "total"))
    assert got[("edge_agent_camera_latency_seconds", latency)] == 0.06, "60 ms"
    assert got[("edge_agent_camera_source_up", cam0)] == 1
    assert got[("edge_agent_temperature_celsius", (("zone", "cpu-thermal"),))] == 61.5
    assert ("edge_agent_temperature_celsius", (("zone", "gpu"),)) not in got, "an unknown zone is left out"
    assert got[("edge_agent_power_watts", ())] == 6.06
    assert got[("edge_agent_rail_power_watts", (("rail", "VDD_IN"),))] == 6.06
    assert got[("edge_agent_battery_percent", ())] == 81.0
    assert got[("edge_agent_under_voltage", ())] == 1
    assert got[("edge_agent_governor_thermal", (("edge_agent_governor_thermal", "WARM"),))] == 1
    assert got[("edge_agent_governor_thermal", (("edge_agent_governor_thermal", "NORMAL"),))] == 0
    assert got[("edge_agent_governor_battery", (("edge_agent_governor_battery", "OK"),))] == 1
    assert got[("edge_agent_governor_fps_cap", ())] == 10.0
    assert got[("edge_agent_governor_gate_slowdown", ())] == 1.0
    assert got[("edge_agent_process_rss_bytes", ())] == full.system.process_rss_mb * 2**20  # type: ignore[union-attr]
    assert got[("edge_agent_disk_free_bytes", ())] == 50_000 * 2**20
    assert got[("edge_agent_disk_size_bytes", ())] == 100_000 * 2**20
    starts = {dict(labels)["level"]: value for (name, labels), value in got.items()
              if name == "edge_agent_governor_threshold_celsius"}  # fmt: skip
    assert starts == {"WARM": 70.0, "HOT": 80.0, "CRITICAL": 90.0}, "the alert rules compare temperatures with HOT"
    assert got[("edge_agent_broker_connected", ())] == 1
    assert got[("edge_agent_mqtt_queued_messages", ())] == 2
    assert got[("edge_agent_mqtt_dropped_messages_total", ())] == 1
    assert got[("edge_agent_mqtt_reconnects_total", ())] == 4
    door = {"camera": "cam0", "line": "door"}
    assert got[("edge_agent_line_crossings_total", _labels(**door, direction="in"))] == 5
    assert got[("edge_agent_line_crossings_total", _labels(**door, direction="out"))] == 2
    till = (("camera", "cam0"), ("zone", "till"))
    assert (got[("edge_agent_zone_objects", till)], got[("edge_agent_zone_entries_total", till)]) == (1, 9)
    info = next(labels for name, labels in got if name == "edge_agent_info")
    assert dict(info) | {"device": "cam-1", "group": "lobby", "bundle": "demo", "bundle_version": "1.0.0"} == dict(info)


def test_the_build_info_names_the_agents_version_and_protocol() -> None:
    """``edge_agent_build_info{version, protocol} 1``, one series, the version the snapshot names."""
    got = _scrape(snapshot(agent_version="0.2.0"))
    builds = {labels: value for (name, labels), value in got.items() if name == "edge_agent_build_info"}
    assert builds == {_labels(version="0.2.0", protocol=str(PROTOCOL)): 1.0}


def test_the_deployment_state_and_health_and_what_is_unknown() -> None:
    deployment = DeploymentStatus("d-1", "demo", "1.1.0", "a" * 64, State.FAILED, None, 1)
    got = _scrape(snapshot(deployment=deployment), healthy=False)
    states = {dict(labels)["edge_agent_deployment_state"]: value for (name, labels), value in got.items()
              if name == "edge_agent_deployment_state"}  # fmt: skip
    assert states == {state.value: float(state is State.FAILED) for state in State}
    assert got[("edge_agent_healthy", ())] == 0
    names = {name for name, _ in got}
    for absent in (
        "edge_agent_power_watts",
        "edge_agent_energy_joules_total",
        "edge_agent_temperature_max_celsius",
        "edge_agent_broker_connected",
    ):
        assert absent not in names, "no sensors, no broker: nothing made up"
    no_disk = dataclasses.replace(snapshot().system, disk_free_mb=None, disk_total_mb=None)  # type: ignore[type-var]
    no_disk_names = {name for name, _ in _scrape(snapshot(system=no_disk))}
    assert {"edge_agent_disk_free_bytes", "edge_agent_disk_size_bytes"} & no_disk_names == set()


JUDGED = DeploymentStatus(
    "d-2", "demo", "2.0.0", "b" * 64, State.SUCCEEDED, None, 1,
    shadow=shadow("agrees", cameras=(shadow_camera("cam0", 0.95, frames=120, crops=40, top1=0.975),
                                     shadow_camera("door", 0.91, frames=80))),
    quality=quality("blind", cameras=(rate_camera("cam0", 0.05), rate_camera("door", None)),
                    agreement=shadow("disagrees", cameras=(shadow_camera("cam0", 0.12),))),
)  # fmt: skip


def test_the_energy_counter_is_in_joules_where_the_power_is_measured() -> None:
    got = _scrape(full_snapshot(energy=Energy(joules=7200.0, measured_s=1800.0)))
    assert got[("edge_agent_energy_joules_total", ())] == 7200.0  # 2 Wh, not 2 nor 7.2
    assert "edge_agent_energy_joules_total" not in {name for name, _ in _scrape(full_snapshot())}


def test_the_shadow_and_probation_quality_per_camera_and_their_outcomes() -> None:
    got = _scrape(snapshot(deployment=JUDGED))
    cam0, door = (("camera", "cam0"),), (("camera", "door"),)
    assert (got[("edge_agent_shadow_agreement", cam0)], got[("edge_agent_shadow_agreement", door)]) == (0.95, 0.91)
    assert (got[("edge_agent_shadow_frames", cam0)], got[("edge_agent_shadow_frames", door)]) == (120, 80)
    assert got[("edge_agent_shadow_min_agreement", ())] == 0.8
    assert got[("edge_agent_shadow_top1_agreement", cam0)] == 0.975
    assert ("edge_agent_shadow_top1_agreement", door) not in got, "no second stage compared there: no value"
    shadow_outcome = {dict(labels)["edge_agent_shadow_outcome"]: value for (name, labels), value in got.items()
                      if name == "edge_agent_shadow_outcome"}  # fmt: skip
    assert shadow_outcome == {"running": 0, "agrees": 1, "disagrees": 0, "quiet": 0}
    assert got[("edge_agent_probation_quality_ratio", cam0)] == 0.05
    assert ("edge_agent_probation_quality_ratio", door) not in got, "a quiet camera was not judged: no value"
    assert got[("edge_agent_probation_quality_min_ratio", ())] == 0.5
    probation = {dict(labels)["edge_agent_probation_quality_outcome"]: value for (name, labels), value in got.items()
                 if name == "edge_agent_probation_quality_outcome"}  # fmt: skip
    assert probation == {"kept": 0, "blind": 1, "quiet": 0}
    assert got[("edge_agent_probation_agreement", cam0)] == 0.12
    assert ("edge_agent_probation_agreement", door) not in got
    not_compared = _scrape(snapshot(deployment=dataclasses.replace(JUDGED, quality=quality("kept"))))
    assert "edge_agent_probation_agreement" not in {name for name, _ in not_compared}
    unjudged = {
        name for name, _ in _scrape(snapshot(deployment=dataclasses.replace(JUDGED, shadow=None, quality=None)))
    }
    assert not {n for n in unjudged if n.startswith(("edge_agent_shadow", "edge_agent_probation"))}, "none judged: none"


def test_the_media_store_and_the_clips_counters() -> None:
    from agent.snapshot import MediaUsage

    found = _scrape(snapshot(media=MediaUsage(5, 123_456, 60.0, clips_written=3, clips_dropped=2)))
    assert found[("edge_agent_media_files", ())] == 5 and found[("edge_agent_media_bytes", ())] == 123_456
    assert found[("edge_agent_clips_written_total", ())] == 3
    assert found[("edge_agent_clips_dropped_total", ())] == 2
    assert not any(name.startswith("edge_agent_clips") for name, _ in _scrape(snapshot(media=None)))


def test_the_outbox_counts_its_drops_by_kind_and_the_times_it_was_made_again() -> None:
    from agent.mqtt.outbox import Dropped, OutboxStats

    outbox = OutboxStats(3, 4096, 2**20, None, Dropped(event=4, full=4), 1000.0, 9, recreated=2)
    found = _scrape(full_snapshot(outbox=outbox))
    assert found[("edge_agent_outbox_dropped_messages_total", _labels(kind="event"))] == 4
    assert found[("edge_agent_outbox_recreated_total", ())] == 2


def test_every_metric_is_documented_with_its_type() -> None:
    """docs/status-page.md's metrics table names every family a full snapshot gives, by its
    exposed name (a counter with ``_total``), with the type the exposition says."""
    from pathlib import Path

    table = (Path(__file__).resolve().parents[3] / "docs" / "status-page.md").read_text()
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| `edge_agent") and len(cells) >= 2:
            for name in cells[0].replace("`", "").split(","):
                rows[name.strip()] = cells[1]
    from agent.mqtt.outbox import Dropped, OutboxStats
    from agent.snapshot import MediaUsage

    outbox = OutboxStats(3, 4096, 2**20, 1.5, Dropped(telemetry=2, full=2), 1000.0, 9)
    every = full_snapshot(
        outbox=outbox, media=MediaUsage(2, 2048, 60.0, 1, 0), deployment=JUDGED, energy=Energy(300.0, 20.0)
    )
    text = generate_latest(metrics_registry(lambda: every, lambda: Health(True))).decode()
    for family in text_string_to_metric_families(text):
        exposed = family.name + ("_total" if family.type == "counter" else "")
        assert exposed in rows, f"{exposed} is not in docs/status-page.md's metrics table"
        assert family.type in rows[exposed].replace("state set", "gauge"), (
            exposed,
            rows[exposed],
        )  # a state set is exposed as gauges


# -- drift (issue 40) ----------------------------------------------------------------------------------


def test_each_cameras_drift_score_where_it_has_one() -> None:
    from pipelines.drift import CameraDrift, DriftScore

    score = DriftScore(0.42, 0.42, 0.1, 0.0, 0.05, "class mix: car 10% -> 60% of detections")
    drift = (CameraDrift("cam0", "a" * 64, 86400.0, True, score, 0.3), CameraDrift("cam1", None, 0.0, False, None, 0.3))
    found = _scrape(snapshot(drift=drift))
    assert found[("edge_agent_drift_score", _labels(camera="cam0"))] == 0.42
    assert ("edge_agent_drift_score", _labels(camera="cam1")) not in found, "no score yet is not a score of 0"


def test_each_checked_camera_s_health_problems_one_series_per_kind() -> None:
    from testkit.snapshots import camera

    from pipelines.camera_health import KINDS
    from pipelines.health_watch import HealthState, ProblemSeen
    from pipelines.sources.frames import SourceState

    state = HealthState((ProblemSeen("moved", 900.0, "shifted"),), 100.0, 30.0, 0.5, 12.0, 0.0, 1000.0)
    scraped = _scrape(snapshot(cameras=(camera("gate", health=state), camera("yard"))))
    gate = {kind: scraped[("edge_agent_camera_problem", _labels(camera="gate", kind=kind))] for kind in KINDS}
    assert gate == {kind: float(kind == "moved") for kind in KINDS}
    assert not [key for key in scraped if key[0] == "edge_agent_camera_problem" and ("camera", "yard") in key[1]]
    lost = camera("gate", health=state, source_status=SourceState("reconnecting", "no frame", 1))
    assert not [key for key in _scrape(snapshot(cameras=(lost,))) if key[0] == "edge_agent_camera_problem"]
