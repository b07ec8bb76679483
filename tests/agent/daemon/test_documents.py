"""`agent.daemon.documents`: the status, telemetry and deployment documents made from a snapshot
and a record are, byte for byte in JSON, what the code before the typed documents published
(tests/data/documents/, written by that code from the same values; fields added since, such as
telemetry's `in_view`, added there too), and read back on the operator's side as the values they
were made from."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from testkit import REPO
from testkit.quality_records import agreement_class, quality, rate_camera, rate_class, shadow, shadow_camera
from testkit.snapshots import full_snapshot, snapshot

from agent.bundles.record import Deployment, ReportRow, State, Tuning, TuningRecord
from agent.daemon.documents import (
    deployment_document,
    deployment_payload,
    last_will,
    status_document,
    status_payload,
    telemetry_document,
    telemetry_payload,
)
from agent.errors import ErrorCode, ErrorInfo
from agent.mqtt.device_documents import (
    MAX_CLASSES,
    MAX_MESSAGE,
    DeploymentDocument,
    DeviceDocument,
    DownloadProgress,
    StatusDocument,
    TelemetryDocument,
)
from agent.mqtt.outbox import MIB, Dropped, OutboxStats
from agent.mqtt.protocol import PROTOCOL

BEFORE = REPO / "tests" / "data" / "documents"


def _record() -> Deployment:
    """The record tests/data/documents/deployment.json was written from."""
    choice = Tuning("onnxruntime", "CPUExecutionProvider", "m.onnx", "fp32", 2, 1, 31.5, 40.25, "fastest")
    parity = {"max_abs_err": 0.0, "detection_agreement": 1.0, "within_tolerance": 1.0}
    rows = (
        ReportRow("onnxruntime", "CPUExecutionProvider", "m.onnx", "fp32", 1, 2, {"p50": 30.0, "p95": 40.25}, 31.5,
                  120.5, None, parity),
        ReportRow("litert", "xnnpack", "m.tflite", "int8", 1, None, error="cannot load"),
    )  # fmt: skip
    return Deployment(
        id="demo-1.1.0-abc",
        sha256="b" * 64,
        state=State.REJECTED,
        name="demo",
        version="1.1.0",
        error=ErrorInfo(ErrorCode.PARITY_FAILED, "0.91 of the outputs within tolerance"),
        from_sha="a" * 64,
        probation_s=60.0,
        history=(
            (State.QUEUED, 1000.0),
            (State.DOWNLOADING, 1000.5),
            (State.VERIFYING, 1010.25),
            (State.REJECTED, 1010.5),
        ),
        tuning=TuningRecord(choice, rows),
    )


PROGRESS = DownloadProgress(4, 4, 65536, 65536, 1, 3, 0)
BARE = Deployment(id="rollback-aaaa", sha256="a" * 64, state=State.ROLLED_BACK, name="demo", version="1.0.0",
                  history=((State.ROLLED_BACK, 1200.0),))  # fmt: skip

CASES: dict[str, tuple[bytes, DeviceDocument, type[DeviceDocument]]] = {
    "status.json": (status_payload(full_snapshot()), status_document(full_snapshot()), StatusDocument),
    "status-bare.json": (
        status_payload(snapshot(cameras=(), bundle=None)),
        status_document(snapshot(cameras=(), bundle=None)),
        StatusDocument,
    ),
    "telemetry.json": (telemetry_payload(full_snapshot()), telemetry_document(full_snapshot()), TelemetryDocument),
    "telemetry-bare.json": (
        telemetry_payload(snapshot(cameras=(), system=None)),
        telemetry_document(snapshot(cameras=(), system=None)),
        TelemetryDocument,
    ),
    "deployment.json": (
        deployment_payload(_record(), PROGRESS),
        deployment_document(_record(), PROGRESS),
        DeploymentDocument,
    ),
    "deployment-bare.json": (deployment_payload(BARE), deployment_document(BARE), DeploymentDocument),
}


def _key_order(value: Any) -> Any:
    """Every object's keys in order, nested (JSON equality ignores the order)."""
    if isinstance(value, dict):
        return [(key, _key_order(item)) for key, item in value.items()]
    if isinstance(value, list):
        return [_key_order(item) for item in value]
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_each_document_is_on_the_wire_what_it_was_before_the_types(name: str) -> None:
    payload, _, _ = CASES[name]
    before = json.loads((BEFORE / name).read_text())
    assert json.loads(payload) == before
    assert _key_order(json.loads(payload)) == _key_order(before), "the keys keep their order"


@pytest.mark.parametrize("name", list(CASES))
def test_each_document_reads_back_as_the_value_it_was_made_from(name: str) -> None:
    payload, document, kind = CASES[name]
    assert kind.read(payload, f"edge/cam-1/{name}") == document
    assert kind.read((BEFORE / name).read_bytes(), name) == document, "what older devices published reads the same"


def test_the_read_back_values_are_typed() -> None:
    record = DeploymentDocument.read((BEFORE / "deployment.json").read_bytes(), "edge/cam-1/deployment")
    assert isinstance(record, DeploymentDocument)
    assert record.state is State.REJECTED and record.error is not None and record.error.code is ErrorCode.PARITY_FAILED
    assert record.progress == PROGRESS and [h.state for h in record.history][-1] is State.REJECTED
    assert record.tuning is not None and record.tuning.choice is not None and record.tuning.choice.threads == 2
    telemetry = TelemetryDocument.read((BEFORE / "telemetry.json").read_bytes(), "t")
    assert isinstance(telemetry, TelemetryDocument) and telemetry.sensors.rails["VDD_IN"].power_w == 6.06
    assert telemetry.analytics.lines["door"].in_ == 5 and telemetry.pipelines[0].latency_ms["total"].p95 == 60.0
    older = json.loads((BEFORE / "telemetry.json").read_text())
    for pipeline in older["pipelines"]:
        del pipeline["in_view"]  # what a device before the objects-in-view telemetry sent
    assert [p.in_view for p in TelemetryDocument.read(json.dumps(older).encode(), "t").pipelines] == [{}, {}]
    bare = TelemetryDocument.read((BEFORE / "telemetry-bare.json").read_bytes(), "t")
    assert isinstance(bare, TelemetryDocument) and bare.system is None, "{} until the first sample"


def test_the_last_will_is_the_minimal_status() -> None:
    """The will names the agent's version and protocol, so `fleet status --version-filter` and
    the CLI's too-old check still know an offline device."""
    will = last_will("dev1", "0.2.0")
    assert json.loads(will) == {"state": "offline", "device": "dev1", "agent_version": "0.2.0", "protocol": PROTOCOL}
    status = StatusDocument.read(will, "edge/dev1/status")
    assert isinstance(status, StatusDocument) and (status.state, status.bundle, status.pipelines) == (
        "offline",
        None,
        (),
    )


def test_a_record_without_a_download_has_no_progress_key() -> None:
    assert "progress" not in json.loads(deployment_payload(BARE))
    assert json.loads(deployment_payload(BARE, PROGRESS))["progress"]["chunks_done"] == 4


def test_the_records_fields_are_all_on_the_wire() -> None:
    """A field added to the record and forgotten in its document fails here."""
    from dataclasses import fields

    assert {f.name for f in fields(Deployment)} | {"progress"} == set(DeploymentDocument.model_fields)
    judged = dataclasses.replace(_record(), shadow=shadow(), quality=quality(), kind="agent")
    assert set(json.loads(deployment_payload(judged, PROGRESS))) == set(DeploymentDocument.model_fields)
    assert "kind" not in json.loads(deployment_payload(_record())), "a model bundle's record says no kind"


def test_the_shadow_and_quality_results_go_out_and_read_back_as_the_record_has_them() -> None:
    record = dataclasses.replace(
        BARE, state=State.REJECTED, error=ErrorInfo(ErrorCode.SHADOW_DISAGREES, "camera cam0: agreement 0.31 < 0.8")
    )
    assert not {"shadow", "quality"} & set(json.loads(deployment_payload(record))), "none yet: no keys"
    judged = dataclasses.replace(record, shadow=shadow("disagrees"), quality=quality("blind"))
    sent = json.loads(deployment_payload(judged))
    assert sent["shadow"]["outcome"] == "disagrees" and sent["shadow"]["cameras"][1]["camera"] == "door"
    assert sent["shadow"]["cameras"][0]["classes"][1] == {
        "class_id": 2, "label": "class2", "serving": 40, "candidate": 40, "matched": 38, "agreement": 0.95,
        "confident_ratio": 1.0,
    }  # fmt: skip
    assert sent["quality"]["outcome"] == "blind" and sent["quality"]["cameras"][0]["ratio"] == 0.05
    read = DeploymentDocument.read(deployment_payload(judged), "edge/cam-1/deployment")
    assert isinstance(read, DeploymentDocument)
    assert (read.shadow, read.quality) == (judged.shadow, judged.quality)


def test_a_shadow_of_a_thousand_classes_goes_out_with_the_twenty_seen_most() -> None:
    many = tuple(agreement_class(c, serving=c % 50, matched=0) for c in range(1000))
    rates = tuple(rate_class(c, before=float(c % 40), after=0.0) for c in range(1000))
    record = dataclasses.replace(
        BARE,
        shadow=shadow("disagrees", cameras=(shadow_camera(classes=many),), message="x" * 100_000),
        quality=quality("blind", cameras=(rate_camera(classes=rates),), message="y" * 100_000),
    )
    payload = deployment_payload(record)
    assert len(payload) < 16_000
    sent = json.loads(payload)
    classes = sent["shadow"]["cameras"][0]["classes"]
    assert len(classes) == MAX_CLASSES == 20 and {c["serving"] for c in classes} == {49}
    assert [c["class_id"] for c in classes] == sorted(c["class_id"] for c in classes), "in class order"
    assert {c["before_per_min"] for c in sent["quality"]["cameras"][0]["classes"]} == {39.0}
    assert len(sent["shadow"]["message"]) == len(sent["quality"]["message"]) == MAX_MESSAGE
    assert len(record.shadow.cameras[0].classes) == 1000, "the record on the device keeps them all"  # type: ignore[union-attr]


def test_telemetry_carries_the_outbox_when_there_is_one() -> None:
    stats = OutboxStats(
        messages=12,
        bytes=40960,
        max_bytes=MIB,
        oldest_age_s=95.5,
        dropped=Dropped(telemetry=7, event=3, full=8, expired=1, refused=1),
        since=900.0,
        last_seq=345,
        recreated=2,
    )
    sent = json.loads(telemetry_payload(snapshot(outbox=stats)))["outbox"]
    assert sent == {
        "messages": 12,
        "bytes": 40960,
        "oldest_age_s": 95.5,
        "dropped": {
            "telemetry": 7,
            "event": 3,
            "deployment": 0,
            "full": 8,
            "expired": 1,
            "unwritten": 0,
            "too_big": 0,
            "refused": 1,
        },
        "since": 900.0,
        "last_seq": 345,
        "problem": None,
        "recreated": 2,
    }
    read = TelemetryDocument.read(telemetry_payload(snapshot(outbox=stats)), "t")
    assert isinstance(read, TelemetryDocument) and read.outbox is not None and read.outbox.dropped.telemetry == 7
    assert "outbox" not in json.loads(telemetry_payload(snapshot())), "no outbox (no broker): no key"


def test_telemetry_carries_the_energy_per_hour_only_where_the_power_is_measured() -> None:
    from agent.hardware.energy import Energy

    sent = json.loads(telemetry_payload(full_snapshot(energy=Energy(joules=10800.0, measured_s=1800.0))))
    assert (sent["energy_wh"], sent["energy_wh_per_h"]) == (3.0, 6.0)  # 6 W for half an hour
    assert (
        TelemetryDocument.read(telemetry_payload(full_snapshot(energy=Energy(10800.0, 1800.0))), "t").energy_wh == 3.0
    )
    unmeasured = json.loads(telemetry_payload(full_snapshot()))
    assert "energy_wh" not in unmeasured and "energy_wh_per_h" not in unmeasured
    status = full_snapshot(energy=Energy(10800.0, 1800.0)).to_json()["energy"]
    assert status == {"energy_wh": 3.0, "energy_wh_per_h": 6.0, "measured_s": 1800.0}


def test_the_analytics_say_since_when_they_count() -> None:
    sent = json.loads(telemetry_payload(full_snapshot(analytics_since=1234.5678)))["analytics"]
    assert sent["since"] == 1234.568 and sent["lines"]["door"] == {"in": 5, "out": 2}
    assert "since" not in json.loads(telemetry_payload(full_snapshot()))["analytics"]
    read = TelemetryDocument.read(telemetry_payload(full_snapshot(analytics_since=1234.5678)), "t")
    assert isinstance(read, TelemetryDocument) and read.analytics.since == 1234.568


@pytest.mark.parametrize("name", ["status.json", "telemetry.json"])
def test_cameras_carry_the_cameras_and_pipelines_the_same_for_one_release(name: str) -> None:
    """``cameras`` is the field; ``pipelines``, its old name, holds the same until the next
    release, and a document of an older device (``pipelines`` only) reads with its cameras."""
    payload, document, kind = CASES[name]
    sent = json.loads(payload)
    assert sent["cameras"] == sent["pipelines"] and len(sent["cameras"]) == 2
    older = {key: value for key, value in sent.items() if key != "cameras"}
    read = kind.read(json.dumps(older).encode(), name)
    assert read == document and read.cameras == document.pipelines


# -- drift (issue 40) ----------------------------------------------------------------------------------


def test_telemetry_carries_each_cameras_drift_score_once_it_has_one() -> None:
    from pipelines.drift import CameraDrift, DriftScore

    score = DriftScore(0.42, 0.42, 0.1, 0.0, 0.05, "class mix: car 10% -> 60% of detections")
    drift = (CameraDrift("cam0", "a" * 64, 86400.0, True, score, 0.3),)
    sent = json.loads(telemetry_payload(snapshot(drift=drift)))
    assert sent["cameras"][0]["drift"] == 0.42  # bug: the score left out of the camera's telemetry
    waiting = (CameraDrift("cam0", "a" * 64, 600.0, False, None, 0.3),)
    assert "drift" not in json.loads(telemetry_payload(snapshot(drift=waiting)))["cameras"][0]


def test_telemetry_carries_a_camera_s_health_while_it_is_checked() -> None:
    """The problem kinds and the numbers; no ``health`` key while the check is off (the documents
    of cameras without one stay byte for byte the same)."""
    from testkit.snapshots import camera

    from pipelines.health_watch import HealthState, ProblemSeen

    state = HealthState(
        problems=(
            ProblemSeen("defocused", 990.0, "sharpness 0.10, 20% of its baseline"),
            ProblemSeen("moved", 995, ""),
        ),
        luminance=101.5,
        contrast=30.2,
        sharpness=0.104,
        shift_px=12.5,
        rotation_deg=0.3,
        at=1000.0,
    )
    cameras = (camera("gate", health=state), camera("yard"))
    sent = json.loads(telemetry_payload(snapshot(cameras=cameras)))["cameras"]
    assert sent[0]["health"] == {
        "problems": ["defocused", "moved"],
        "luminance": 101.5,
        "contrast": 30.2,
        "sharpness": 0.104,
        "shift_px": 12.5,
        "rotation_deg": 0.3,
    }
    assert "health" not in sent[1]
    read = TelemetryDocument.read(telemetry_payload(snapshot(cameras=cameras)), "t")
    assert isinstance(read, TelemetryDocument) and read.cameras[0].health is not None
    assert read.cameras[0].health.problems == ["defocused", "moved"] and read.cameras[1].health is None
