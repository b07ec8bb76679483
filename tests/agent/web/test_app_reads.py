"""`agent.web.app` beside test_app.py: the snapshot one poll shares (`RecentSnapshot` on an
injected clock), query numbers clamped to their range, each refusal's HTTP status and /healthz, over
real HTTP against hand-made `AgentControls`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from testkit.net import free_port
from testkit.page import http
from testkit.snapshots import snapshot

from agent.config.models import StatusPageSection
from agent.errors import CodedError, ErrorCode
from agent.snapshot import AgentSnapshot, DeploymentStatus, Health
from agent.web.app import RecentSnapshot
from agent.web.controls import AgentControls
from agent.web.server import StatusServer


def test_a_snapshot_serves_for_its_age_then_is_read_again() -> None:
    now = [100.0]
    reads: list[AgentSnapshot] = []

    def read() -> AgentSnapshot:
        reads.append(snapshot(ts=now[0]))
        return reads[-1]

    recent = RecentSnapshot(read, max_age_s=1.0, clock=lambda: now[0])
    first = recent()
    now[0] = 101.0  # exactly its age: still the same poll
    assert recent() is first and len(reads) == 1
    now[0] = 101.01
    second = recent()
    assert second is not first and second.ts == 101.01 and len(reads) == 2
    recent.forget()  # an action happened
    assert recent() is not second and len(reads) == 3


QUALITIES: list[int] = []


def jpeg(camera: str, quality: int) -> bytes:
    if camera == "busy":
        raise CodedError(ErrorCode.BUSY, "a deployment is activating")
    if camera == "broken":
        raise CodedError(ErrorCode.COMMAND_FAILED, "the encoder failed")
    if camera != "cam0":
        raise CodedError(ErrorCode.NO_PIPELINE, f"no camera {camera}")
    QUALITIES.append(quality)
    return b"\xff\xd8jpeg"


def never() -> DeploymentStatus:
    raise AssertionError("not called: the page has no credentials, so no actions")


@pytest.fixture(scope="module")
def page() -> Iterator[str]:
    controls = AgentControls(
        snapshot=snapshot,
        health=lambda: Health(False, ("the camera loop of cam0 stalled",)),
        rollback=never,
        restart=lambda camera: [camera],
        camera_jpeg=jpeg,
        events=list,
    )
    server = StatusServer(StatusPageSection(listen=f"127.0.0.1:{free_port()}"), controls).start()
    yield server.url
    server.stop()


def test_the_jpeg_quality_defaults_to_80_and_an_outside_one_is_refused(page: str) -> None:
    QUALITIES.clear()
    for query in ("", "?quality=55", "?quality=100", "?quality=1"):
        answer = http(page + "api/cameras/cam0/snapshot.jpg" + query)
        assert answer.status == 200 and answer.headers["content-type"] == "image/jpeg"
        assert answer.body == b"\xff\xd8jpeg" and answer.headers["cache-control"] == "no-store"
    for query in ("?quality=500", "?quality=0", "?quality=high", "?quality=nan"):
        answer = http(page + "api/cameras/cam0/snapshot.jpg" + query)
        assert (answer.status, answer.json()["error"]["code"]) == (400, "BAD_PAYLOAD"), query
    assert QUALITIES == [80, 55, 100, 1]


@pytest.mark.parametrize(
    ("camera", "status", "code"),
    [("busy", 503, "BUSY"), ("nowhere", 404, "NO_PIPELINE"), ("broken", 500, "COMMAND_FAILED")],
)
def test_each_refusal_has_its_status_and_code(page: str, camera: str, status: int, code: str) -> None:
    answer = http(page + f"api/cameras/{camera}/snapshot.jpg")
    assert (answer.status, answer.json()["ok"], answer.json()["error"]["code"]) == (status, False, code)


def test_healthz_is_503_with_the_problems(page: str) -> None:
    health = http(page + "healthz")
    assert health.status == 503 and health.json() == {"ok": False, "problems": ["the camera loop of cam0 stalled"]}
