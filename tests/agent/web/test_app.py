"""`agent.web.app` over real HTTP, served against hand-made `AgentControls` (no daemon): the
recent events are the ``events`` topic's documents, less ``device`` and crops."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from testkit.control import Clock
from testkit.net import free_port
from testkit.page import Answer, basic, http
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
        camera="cam0",
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


class Acting:
    """A page with credentials on a test clock: the qualities asked of `camera_jpeg`, the
    rollbacks and restarts that reached the agent."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("TEST_PAGE_PASSWORD", "pw")
        self.clock = Clock(0.0)
        self.qualities: list[int] = []
        self.rollbacks = 0
        self.restarts: list[str] = []
        controls = AgentControls(
            snapshot=snapshot,
            health=lambda: Health(True),
            rollback=self._rollback,
            restart=self._restart,
            camera_jpeg=self._jpeg,
            events=list,
        )
        settings = StatusPageSection(
            listen=f"127.0.0.1:{free_port()}",
            username="tech",
            password_env="TEST_PAGE_PASSWORD",
            hosts=["cams.example.org", "Proxy.Local."],
        )
        self.server = StatusServer(settings, controls, clock=self.clock, hostname="Cam-7").start()
        self.url = self.server.url

    def _rollback(self) -> DeploymentStatus:
        self.rollbacks += 1
        return refuse()

    def _restart(self, camera: str) -> list[str]:
        self.restarts.append(camera)
        return [camera]

    def _jpeg(self, camera: str, quality: int) -> bytes:
        self.qualities.append(quality)
        return b"\xff\xd8jpeg"

    def post(self, path: str) -> Answer:
        return http(self.url + path, "POST", AUTH, b"{}")


AUTH = basic("tech", "pw")


@pytest.fixture
def acting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Acting]:
    page = Acting(monkeypatch)
    yield page
    page.server.stop()


@pytest.mark.parametrize("quality", ["nan", "NaN", "inf", "-inf", "0", "101", "abc", "1e400", ""])
def test_a_snapshot_quality_that_is_not_a_number_in_range_is_400_and_asks_nothing(acting: Acting, quality: str) -> None:
    answer = http(acting.url + f"api/cameras/cam0/snapshot.jpg?quality={quality}", headers=AUTH)
    assert answer.status == 400, answer.body
    error = answer.json()["error"]
    assert error["code"] == "BAD_PAYLOAD" and "quality must be a number from 1 to 100" in error["message"]
    assert "Traceback" not in answer.body.decode() and acting.qualities == []


def test_a_snapshot_quality_in_range_reaches_the_camera(acting: Acting) -> None:
    for query, expected in (("?quality=1", 1), ("?quality=100", 100), ("?quality=55.4", 55), ("", 80)):
        answer = http(acting.url + f"api/cameras/cam0/snapshot.jpg{query}", headers=AUTH)
        assert answer.status == 200 and answer.headers["content-type"] == "image/jpeg"
        assert acting.qualities[-1] == expected
    assert http(acting.url + "api/history?since=nan", headers=AUTH).status == 400


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("evil.example:{port}", 421),  # a name rebound to the device's address
        ("evil.example", 421),
        ("cam-7.evil.example:{port}", 421),
        ("127.0.0.1:{port}", 200),
        ("10.0.0.41:{port}", 200),  # any address: the browser's origin is then that address
        ("[::1]:{port}", 200),
        ("localhost:{port}", 200),
        ("cam-7:{port}", 200),  # the host name, any case, also with .local
        ("CAM-7.local.:{port}", 200),
        ("cams.example.org", 200),  # status_page.hosts
        ("proxy.local:{port}", 200),
    ],
)
def test_the_host_header_must_name_the_device(acting: Acting, host: str, status: int) -> None:
    port = acting.url.rsplit(":", 1)[1].strip("/")
    answer = http(acting.url + "api/status", headers={**AUTH, "Host": host.format(port=port)})
    assert answer.status == status, answer.body
    if status == 421:
        assert answer.json()["error"]["code"] == "WRONG_HOST"
        refused = http(acting.url + "api/rollback", "POST", {**AUTH, "Host": host.format(port=port)}, b"{}")
        assert refused.status == 421 and acting.rollbacks == 0
    probe = http(acting.url + "healthz", headers={"Host": "evil.example"})
    assert probe.status == 200, "probes name the device as they like"


def test_page_actions_are_paced_with_retry_after(acting: Acting, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="agent.web.app"):
        assert [acting.post("api/rollback").status for _ in range(2)] == [409, 409]
        refused = acting.post("api/rollback")
        assert refused.status == 429 and refused.headers["retry-after"] == "30", refused.body
        assert refused.json()["error"]["code"] == "BUSY" and "try again in 30 s" in refused.json()["error"]["message"]
        assert acting.rollbacks == 2, "a paced rollback never reaches the agent"
        acting.clock.now = 29.5
        assert acting.post("api/rollback").headers["retry-after"] == "1"
        acting.clock.now = 30.0
        assert acting.post("api/rollback").status == 409 and acting.rollbacks == 3

        answers = [acting.post("api/cameras/cam0/restart") for _ in range(208)]
    assert [a.status for a in answers[:6]] == [200] * 5 + [429] and len(acting.restarts) == 5
    assert answers[5].headers["retry-after"] == "5"
    acting.clock.now = 35.0
    assert acting.post("api/cameras/cam0/restart").status == 200 and len(acting.restarts) == 6
    audit = [line["message"] for line in http(acting.url + "api/logs", headers=AUTH).json() if line["audit"]]
    assert sum("rollback requested" in m for m in audit) == 3 and sum("restart of camera" in m for m in audit) == 6
    paced = [r.getMessage() for r in caplog.records if "asked too often" in r.getMessage()]
    # rollback at 0 s and 29.5 s, restart at 30 s (203 refused): a line per action and 10 s, not per refusal
    assert len(paced) == 3, paced


def test_a_camera_s_reference_image_is_read_behind_the_login_and_a_new_view_accepted_as_an_action(
    tmp_path: Path,
) -> None:
    """A real health check whose view moved: ``reference.jpg`` is its reference (401 without the
    page's login, 404 ``NO_PIPELINE`` for a camera without one); ``accept-view`` is an action
    (refused cross-site), and the check's next frame is the new reference: "moved" clears."""
    import cv2
    import numpy as np
    from testkit.health_clips import HealthScene, warped

    from pipelines.annotate import encode_jpeg
    from pipelines.camera_health import HealthThresholds
    from pipelines.health_watch import HealthWatch
    from pipelines.sources.frames import Frame

    scene, watch = HealthScene(320, 180, seed=5), HealthWatch("gate", HealthThresholds(reference_after_s=5, hold_s=1))
    for second in range(20):
        picture = scene.render(second) if second < 12 else warped(scene.render(second), shift_fraction=0.1)
        watch.offer(Frame(second, float(second), picture))
    assert watch.state is not None and watch.state.kinds == ("moved",)

    def reference(camera: str) -> bytes:
        if camera != "gate" or watch.reference is None:
            raise CodedError(ErrorCode.NO_PIPELINE, f"no camera named {camera!r} with a health check")
        return encode_jpeg(watch.reference)

    def accept(camera: str) -> None:
        reference(camera)
        watch.reset_reference()

    controls = AgentControls(
        snapshot=snapshot,
        health=lambda: Health(True),
        rollback=refuse,
        restart=lambda camera: [camera],
        camera_jpeg=no_frame,
        events=list,
        camera_reference=reference,
        accept_view=accept,
    )
    (tmp_path / "password").write_text("s3cret-pw\n")
    section = StatusPageSection(listen=f"127.0.0.1:{free_port()}", username="tech", password_file=tmp_path / "password")
    server = StatusServer(section, controls).start()
    login, url = basic("tech", "s3cret-pw"), server.url
    try:
        assert http(url + "api/cameras/gate/reference.jpg").status == 401
        image = http(url + "api/cameras/gate/reference.jpg", headers=login)
        assert image.status == 200 and image.headers["content-type"] == "image/jpeg"
        decoded = cv2.imdecode(np.frombuffer(image.body, np.uint8), cv2.IMREAD_GRAYSCALE)
        assert watch.reference is not None and decoded.shape == watch.reference.shape
        ghost = http(url + "api/cameras/ghost/reference.jpg", headers=login)
        assert ghost.status == 404 and ghost.json()["error"]["code"] == "NO_PIPELINE"

        host = url.split("/")[2]
        cross = http(url + "api/cameras/gate/accept-view", "POST", {**login, "Origin": "http://evil"}, b"")
        assert cross.status == 403 and cross.json()["error"]["code"] == "CROSS_SITE"
        watch.offer(Frame(20, 20.0, warped(scene.render(20), shift_fraction=0.1)))
        assert watch.state.kinds == ("moved",), "refused: the reference stands"
        same = http(url + "api/cameras/gate/accept-view", "POST", {**login, "Origin": f"http://{host}"}, b"")
        assert same.status == 200 and same.json() == {"ok": True, "camera": "gate"}
        watch.offer(Frame(21, 21.0, warped(scene.render(21), shift_fraction=0.1)))
        assert watch.state.kinds == (), "the new view is the reference"
        unknown = http(url + "api/cameras/ghost/accept-view", "POST", {**login, "Origin": f"http://{host}"}, b"")
        assert unknown.status == 404 and unknown.json()["error"]["code"] == "NO_PIPELINE"
    finally:
        server.stop()
