"""`agent.web.app` over real HTTP, served against hand-made `AgentControls` (no daemon): the
recent events are the ``events`` topic's documents, less ``device`` and crops."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from testkit.net import free_port
from testkit.page import http
from testkit.snapshots import snapshot

from agent.config.models import StatusPageSection
from agent.errors import CodedError, ErrorCode
from agent.event_values import Event, GovernorEvent, LineCrossing, ObjectEvent
from agent.governor.levels import BatteryLevel, ThermalLevel
from agent.mqtt.protocol import json_payload
from agent.snapshot import DeploymentStatus, Health
from agent.web.controls import AgentControls
from agent.web.server import StatusServer

EVENTS: list[Event] = [
    GovernorEvent(1000.0004, "HOT", "NORMAL", ThermalLevel.HOT, BatteryLevel.OK, "75.0 °C reached HOT", 75.0, None),
    ObjectEvent(
        kind="end",
        ts=1001.23456,
        pipeline="cam0",
        object_id="0123456789abcdef",
        track_id=3,
        label="person",
        class_id=0,
        confidence=0.912345,
        box=(1.04, 2.06, 30.0, 40.55),
        frame=17,
        duration_s=2.5,
        zones=(("bay", 1.25),),
        lines=(LineCrossing("door", "backward"),),
    ),
]


def refuse() -> DeploymentStatus:
    raise CodedError(ErrorCode.NO_PREVIOUS, "no previous version")


def no_frame(camera: str, quality: int) -> bytes:
    raise CodedError(ErrorCode.NO_FRAME, "no frame yet")


@pytest.fixture
def page() -> Iterator[str]:
    controls = AgentControls(
        snapshot=snapshot,
        health=lambda: Health(True),
        rollback=refuse,
        restart=lambda camera: [camera],
        camera_jpeg=no_frame,
        events=lambda: list(EVENTS),
    )
    server = StatusServer(StatusPageSection(listen=f"127.0.0.1:{free_port()}"), controls).start()
    yield server.url
    server.stop()


def test_recent_events_are_the_events_topic_documents_without_device(page: str) -> None:
    answer = http(page + "api/events")
    assert answer.status == 200 and answer.headers["cache-control"] == "no-store"
    on_the_topic = [json.loads(json_payload({"device": "cam-1", **event.to_json()})) for event in EVENTS]
    assert answer.json() == [{k: v for k, v in document.items() if k != "device"} for document in on_the_topic]
    governor, end = answer.json()
    assert governor == {
        "type": "governor",
        "ts": 1000.0,
        "level": "HOT",
        "previous": "NORMAL",
        "thermal": "HOT",
        "battery": "OK",
        "reason": "75.0 °C reached HOT",
        "temp_c": 75.0,
        "battery_percent": None,
    }
    assert (end["type"], end["confidence"], end["box"], end["zones"], end["lines"]) == (
        "end",
        0.9123,
        [1.0, 2.1, 30.0, 40.5],
        {"bay": 1.25},
        [{"line": "door", "direction": "backward"}],
    )
    assert "snapshot_jpeg" not in end
