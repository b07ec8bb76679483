"""`agent.fleet.state`: the devices' documents read once into their models; `fleet status` rows
show progress, error codes and the last bundle after a will, and junk in a retained document
is shown as unreadable, naming the field, never crashing the table."""

from __future__ import annotations

import dataclasses

import pytest
from testkit.broker import Broker
from testkit.fleet import publish_raw
from testkit.quality_records import quality, rate_camera, shadow, shadow_camera
from testkit.snapshots import snapshot

from agent.bundles.record import Deployment, State
from agent.config.models import MqttSection
from agent.daemon.documents import deployment_payload, last_will, status_payload
from agent.fleet.client import connect
from agent.fleet.state import DeviceReports, fleet_state, quality_text, status_rows
from agent.mqtt.device_documents import DeploymentDocument, StatusDocument, TelemetryDocument, Unreadable
from agent.mqtt.protocol import Topics

SHA = "b" * 64


def status(payload: bytes) -> StatusDocument | Unreadable:
    return StatusDocument.read(payload, "edge/x/status")


def record(payload: bytes) -> DeploymentDocument | Unreadable:
    return DeploymentDocument.read(payload, "edge/x/deployment")


def test_fleet_status_shows_the_last_bundle_after_a_will() -> None:
    succeeded = Deployment(id="d1", sha256=SHA, state=State.SUCCEEDED, name="demo", version="1.1.0")
    will = status(last_will("dev1", "0.2.0"))
    rows = status_rows({"dev1": DeviceReports(will, record(deployment_payload(succeeded)))})
    assert (rows[0].bundle, rows[0].state, rows[0].deployment) == ("demo 1.1.0", "offline", "SUCCEEDED")


def test_fleet_status_rows_show_progress_and_error_codes() -> None:
    online = (
        b'{"state": "online", "group": "g", "bundle": {"name": "demo", "version": "1.0.0", "sha256": "a"}, "fps": 9}'
    )
    downloading = (
        b'{"id": "d", "sha256": "s", "state": "DOWNLOADING", "progress": {"chunks_done": 3, "chunks_total": 4,'
    )
    downloading += b' "bytes_done": 3, "bytes_total": 4, "resumed": 0, "fetched": 3, "duplicates": 0}}'
    rejected = b'{"id": "d", "sha256": "s", "state": "REJECTED", "error": {"code": "PARITY_FAILED", "message": "m"}}'
    rows = status_rows(
        {
            "a": DeviceReports(status(online), record(downloading)),
            "b": DeviceReports(status(b'{"state": "offline"}'), record(rejected)),
        }
    )
    assert [(r.device, r.state, r.group, r.bundle, r.deployment, r.fps) for r in rows] == [
        ("a", "online", "g", "demo 1.0.0", "DOWNLOADING 75%", 9),
        ("b", "offline", None, None, "REJECTED (PARITY_FAILED)", None),
    ]


def test_telemetry_fps_wins_over_the_status_fps() -> None:
    telemetry = TelemetryDocument.read(b'{"ts": 1, "device": "a", "fps": 12.5}', "edge/a/telemetry")
    rows = status_rows({"a": DeviceReports(status(b'{"state": "online", "fps": 9}'), None, telemetry)})
    assert rows[0].fps == 12.5


#: junk a later issue names; each is rejected at the parse, naming the field
JUNK = [
    ("status", b'{"bundle":"x"}', "bundle: "),
    ("deployment", b'{"error":"boom"}', "error: "),
    ("deployment", b'{"progress":"half"}', "progress: "),
    # the same junk in documents that are otherwise whole: the field itself is refused
    ("status", b'{"state": "online", "device": "a", "bundle": "x"}', "bundle: Input should be"),
    ("deployment", b'{"id": "d", "sha256": "s", "state": "REJECTED", "error": "boom"}', "error: Input should be"),
    ("deployment", b'{"id": "d", "sha256": "s", "state": "DOWNLOADING", "progress": "half"}', "progress: Input"),
    ("deployment", b'{"id": "d", "sha256": "s", "state": "GONE"}', "state: Input should be"),
    ("deployment", b'{"id": "d", "sha256": "s", "state": "FAILED", "error": {"code": "OOPS", "message": "m"}}',
     "error.code: "),
    ("status", b"[1, 2]", "(top): Input should be an object"),
    ("deployment", b"{", "(top): Invalid JSON"),
]  # fmt: skip


@pytest.mark.parametrize(("leaf", "payload", "named"), JUNK)
def test_junk_is_rejected_at_the_parse_naming_the_field(leaf: str, payload: bytes, named: str) -> None:
    read = status(payload) if leaf == "status" else record(payload)
    assert isinstance(read, Unreadable) and read.topic == f"edge/x/{leaf}"
    assert named in read.problem and "\n" not in read.problem and len(read.problem) < 400, read.problem


def test_junk_in_any_document_leaves_the_table_whole() -> None:
    good = status(status_payload(snapshot(device="good", group="g")))
    devices = {"good": DeviceReports(good)}
    for i, (leaf, payload, _) in enumerate(JUNK):
        parts = DeviceReports(status=status(payload)) if leaf == "status" else DeviceReports(deployment=record(payload))
        devices[f"junk{i}"] = parts
    rows = {row.device: row for row in status_rows(devices)}
    assert (rows["good"].state, rows["good"].group, rows["good"].bundle) == ("online", "g", "demo 1.0.0")
    for i, (leaf, _, _) in enumerate(JUNK):
        row = rows[f"junk{i}"]
        assert (row.state, row.deployment) == (("unreadable", None) if leaf == "status" else ("?", "unreadable"))


def test_fleet_state_reads_each_document_once_and_keeps_the_unreadable(broker: Broker) -> None:
    rejected = Deployment(id="d1", sha256=SHA, state=State.REJECTED, name="demo", version="2.0.0")
    publish_raw(
        broker,
        [
            ("edge/dev1/status", status_payload(snapshot(device="dev1", group="g"))),
            ("edge/dev1/deployment", deployment_payload(rejected)),
            ("edge/dev2/status", b'{"bundle":"x"}'),
            ("edge/dev2/deployment", b'{"progress":"half"}'),
            ("edge/dev3/telemetry", b"not json"),
        ],
    )
    link = connect(MqttSection(broker=broker.url))
    try:
        devices = fleet_state(link, Topics(), wait=5.0)
    finally:
        link.stop()
    assert sorted(devices) == ["dev1", "dev2", "dev3"]
    dev1 = devices["dev1"]
    assert isinstance(dev1.status, StatusDocument) and dev1.group == "g" and not dev1.unreadable
    assert isinstance(dev1.deployment, DeploymentDocument) and dev1.deployment.state is State.REJECTED
    assert [u.topic for u in devices["dev2"].unreadable] == ["edge/dev2/status", "edge/dev2/deployment"]
    assert devices["dev2"].group is None and devices["dev2"].documents() == {}
    assert [u.topic for u in devices["dev3"].unreadable] == ["edge/dev3/telemetry"]


SHADOW_OF_TWO = (shadow_camera("cam0", 0.95), shadow_camera("door", 0.31))


@pytest.mark.parametrize(
    ("judged", "text"),
    [
        ({}, None),
        ({"shadow": shadow("agrees")}, "shadow agrees 0.91"),
        ({"shadow": shadow("disagrees", cameras=SHADOW_OF_TWO)}, "shadow disagrees 0.31<0.8"),
        ({"shadow": shadow("disagrees", cameras=SHADOW_OF_TWO, mode="report")}, "shadow disagrees 0.31<0.8 (report)"),
        ({"shadow": shadow("quiet")}, "shadow quiet"),
        ({"shadow": shadow("running")}, "shadow running 0.91 so far"),
        ({"shadow": shadow("agrees", cameras=())}, "shadow agrees"),
        ({"quality": quality("kept")}, "probation kept 0.97"),
        ({"quality": quality("blind", cameras=(rate_camera("cam0", 0.05), rate_camera("door", None)))},
         "probation blind 0.05<0.5"),
        ({"quality": quality("quiet", cameras=(rate_camera("cam0", None),))}, "probation quiet"),
        ({"shadow": shadow("agrees"), "quality": quality("kept")}, "shadow agrees 0.91; probation kept 0.97"),
        ({"quality": quality("blind", cameras=(rate_camera("cam0", 1.02),), agreement=shadow("disagrees"))},
         "probation blind 1.02, agreement 0.31<0.8"),
        ({"quality": quality("kept", agreement=shadow("agrees"))}, "probation kept 0.97, agreement 0.91"),
        ({"quality": quality("kept", agreement=shadow("quiet"))}, "probation kept 0.97"),
    ],
)  # fmt: skip
def test_the_quality_text_is_the_outcome_and_the_worst_camera_against_its_minimum(
    judged: dict[str, object], text: str | None
) -> None:
    done = Deployment(id="d1", sha256=SHA, state=State.SUCCEEDED, name="demo", version="1.1.0")
    document = record(deployment_payload(dataclasses.replace(done, **judged)))  # type: ignore[arg-type]
    assert isinstance(document, DeploymentDocument)
    assert quality_text(document) == text


def test_fleet_status_rows_carry_what_the_shadow_and_probation_judged() -> None:
    rejected = Deployment(id="d1", sha256=SHA, state=State.REJECTED, shadow=shadow("disagrees", cameras=SHADOW_OF_TWO))
    kept = Deployment(id="d1", sha256=SHA, state=State.SUCCEEDED, shadow=shadow(), quality=quality())
    online = status(b'{"state": "online"}')
    rows = status_rows(
        {
            "a": DeviceReports(online, record(deployment_payload(rejected))),
            "b": DeviceReports(online, record(deployment_payload(kept))),
            "c": DeviceReports(online, record(b"{")),
            "d": DeviceReports(online),
        }
    )
    assert [r.quality for r in rows] == [
        "shadow disagrees 0.31<0.8",
        "shadow agrees 0.91; probation kept 0.97",
        None,
        None,
    ]
