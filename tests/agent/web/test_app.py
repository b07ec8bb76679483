"""`agent.web.app` over real HTTP, served against hand-made `AgentControls` (no daemon): the
recent events are the ``events`` topic's documents, less ``device`` and crops."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from testkit.net import free_port
from testkit.page import basic, http
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


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[[bool], tuple[str, list[str]]]]:
    """``served(credentials)``: a page (user tech, password s3cret-pw when `credentials`) whose
    camera restarts are recorded; returns its URL and the list of restarted cameras."""
    servers: list[StatusServer] = []

    def serve(credentials: bool) -> tuple[str, list[str]]:
        restarted: list[str] = []
        controls = AgentControls(
            snapshot=snapshot,
            health=lambda: Health(True),
            rollback=refuse,
            restart=lambda camera: restarted.append(camera) or [camera],
            camera_jpeg=no_frame,
            events=lambda: list(EVENTS),
        )
        (tmp_path / "password").write_text("s3cret-pw\n")
        login = {"username": "tech", "password_file": tmp_path / "password"} if credentials else {}
        section = StatusPageSection(listen=f"127.0.0.1:{free_port()}", **login)
        servers.append(StatusServer(section, controls).start())
        return servers[-1].url, restarted

    yield serve
    for server in servers:
        server.stop()


def test_a_camera_restart_is_an_action(served) -> None:
    """POST .../restart is refused like a rollback: 403 where no credentials are set, 403
    cross-site with them (the camera is not restarted either time), 200 same-site."""
    url, restarted = served(False)
    refused = http(url + "api/cameras/cam0/restart", "POST", body=b"")
    assert refused.status == 403 and refused.json()["error"]["code"] == "UNAUTHORIZED" and restarted == []
    url, restarted = served(True)
    host = url.split("/")[2]
    cross = http(url + "api/cameras/cam0/restart", "POST", {**basic("tech", "s3cret-pw"), "Origin": "http://evil"}, b"")
    assert cross.status == 403 and cross.json()["error"]["code"] == "CROSS_SITE" and restarted == []
    same = http(
        url + "api/cameras/cam0/restart", "POST", {**basic("tech", "s3cret-pw"), "Origin": f"http://{host}"}, b""
    )
    assert same.status == 200 and restarted == ["cam0"]


def test_no_answer_carries_the_request_credentials(served) -> None:
    """/api/status and the other reads never echo the Authorization header (or the password)."""
    url, _ = served(True)
    encoded = base64.b64encode(b"tech:s3cret-pw").decode()
    for path in ("api/status", "api/problems", "api/events", "api/logs", "metrics", ""):
        answer = http(url + path, headers=basic("tech", "s3cret-pw"))
        assert answer.status == 200, (path, answer.status)
        everything = answer.body.decode(errors="replace") + json.dumps(answer.headers)
        assert "s3cret-pw" not in everything and encoded not in everything, path
