"""`agent.event_values`: the events as frozen values become the ``events`` topic's documents
byte for byte (docs/mqtt.md's keys in its order, numbers rounded at the edge), and the page's
list without the crops."""

from __future__ import annotations

import dataclasses

import pytest

from agent.event_values import CameraEvent, GovernorEvent, LineCrossing, ObjectEvent
from agent.governor.levels import BatteryLevel, ThermalLevel
from agent.mqtt.protocol import json_payload
from pipelines.camera_health import KINDS

END = ObjectEvent(
    kind="end",
    ts=1_700_000_000.12345,
    camera="door",
    object_id="5f0c1d2e3a4b5c6d",
    track_id=7,
    label="person",
    class_id=0,
    confidence=0.876543219,
    box=(10.04, 20.06, 110.55, 220.0),
    frame=42,
    duration_s=3.14159,
    zones=(("bay", 2.5), ("aisle", 0.1234567)),
    lines=(LineCrossing("door", "forward"), LineCrossing("exit", "backward")),
    snapshot_jpeg=b"\xff\xd8\xff\xe0JFIF",
)


def test_an_object_event_is_the_documented_document_byte_for_byte() -> None:
    assert json_payload({"device": "cam-1", **END.to_json()}) == (
        b'{"device":"cam-1","type":"end","ts":1700000000.123,"camera":"door","pipeline":"door",'
        b'"object_id":"5f0c1d2e3a4b5c6d",'
        b'"track_id":7,"label":"person","class_id":0,"confidence":0.8765,"box":[10.0,20.1,110.5,220.0],'
        b'"frame":42,"duration_s":3.142,"zones":{"bay":2.5,"aisle":0.1234567},'
        b'"lines":[{"line":"door","direction":"forward"},{"line":"exit","direction":"backward"}],'
        b'"snapshot_jpeg":"/9j/4EpGSUY="}'
    )


@pytest.mark.parametrize("kind", ["start", "update"])
def test_an_event_without_a_crop_has_no_snapshot_key(kind: str) -> None:
    event = dataclasses.replace(END, kind=kind, snapshot_jpeg=None, zones=(), lines=())
    document = event.to_json()
    assert list(document) == [
        "type",
        "ts",
        "camera",
        "pipeline",
        "object_id",
        "track_id",
        "label",
        "class_id",
        "confidence",
        "box",
        "frame",
        "duration_s",
        "zones",
        "lines",
    ]
    assert (document["type"], document["zones"], document["lines"]) == (kind, {}, [])


def test_the_page_keeps_events_without_their_crops() -> None:
    listed = END.without_crop()
    assert listed.snapshot_jpeg is None and "snapshot_jpeg" not in listed.to_json()
    assert {**listed.to_json(), "snapshot_jpeg": END.to_json()["snapshot_jpeg"]} == END.to_json()
    assert END.snapshot_jpeg is not None, "the event itself is untouched (frozen)"


def test_a_governor_event_is_the_documented_document_byte_for_byte() -> None:
    event = GovernorEvent(
        ts=1_700_000_001.98765,
        level="CRITICAL",
        previous="HOT",
        thermal=ThermalLevel.CRITICAL,
        battery=BatteryLevel.LOW,
        reason="90.0 °C reached CRITICAL at 85.0 °C",
        temp_c=90.0,
        battery_percent=15.0,
    )
    assert json_payload({"device": "cam-1", **event.to_json()}) == (
        b'{"device":"cam-1","type":"governor","ts":1700000001.988,"level":"CRITICAL","previous":"HOT",'
        b'"thermal":"CRITICAL","battery":"LOW","reason":"90.0 \\u00b0C reached CRITICAL at 85.0 \\u00b0C",'
        b'"temp_c":90.0,"battery_percent":15.0}'
    )
    first = dataclasses.replace(event, previous=None, temp_c=None, battery_percent=None)
    assert (first.to_json()["previous"], first.to_json()["temp_c"], first.to_json()["battery_percent"]) == (
        None,
        None,
        None,
    )
    assert event.without_crop() is event


def test_a_kept_snapshot_is_a_reference_in_place_of_the_crop() -> None:
    kept = dataclasses.replace(END, snapshot_jpeg=None, snapshot=f"{END.object_id}.jpg")
    document = kept.to_json()
    assert document["snapshot"] == f"{END.object_id}.jpg" and "snapshot_jpeg" not in document
    assert list(document)[-1] == "snapshot", "after the documented keys"
    assert kept.without_crop().to_json() == document, "the page's list keeps the reference"


def test_a_camera_event_is_the_documented_document_byte_for_byte() -> None:
    from pipelines.health_watch import ACTIONS, ProblemSeen

    problem = ProblemSeen("moved", 1_700_000_000.12345, "shifted 10.0% of the width, turned 0.1 degrees")
    event = CameraEvent.of("gate", problem, "start", 1_700_000_010.98765)
    assert json_payload({"device": "cam-1", **event.to_json()}) == (
        b'{"device":"cam-1","type":"camera","ts":1700000010.988,"camera":"gate","problem":"moved",'
        b'"change":"start","since":1700000000.123,"detail":"shifted 10.0% of the width, turned 0.1 degrees",'
        b'"action":"the view moved: check the mount and point the camera back, or accept the new view"}'
    )
    assert CameraEvent.of("gate", problem, "end", 1.0).to_json()["change"] == "end"
    assert "reason" not in event.to_json(), "a problem that cleared on its own says no reason"
    gone = CameraEvent.of("gate", problem, "end", 1.0, "camera removed").to_json()
    assert list(gone)[-1] == "reason" and gone["reason"] == "camera removed", "after the documented keys"
    assert event.without_crop() is event
    assert set(ACTIONS) == set(KINDS), "every kind has a technician's action"
