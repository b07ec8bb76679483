"""`agent.daemon.page`: systemd's STATUS= line for each state of the daemon, and the status page
started only when configured, over real HTTP; one that cannot start is logged, not fatal."""

from __future__ import annotations

import dataclasses
import logging
import socket

import pytest
from testkit.net import free_port
from testkit.page import http
from testkit.snapshots import camera, full_snapshot, link, snapshot

from agent.config.models import StatusPageSection
from agent.daemon.page import service_line, start_page
from agent.snapshot import Health, Serving
from agent.web.controls import AgentControls

SERVING = Serving("onnxruntime", "cpu", "m.onnx", "the only runtime")


def test_the_service_line_says_what_serves_at_what_rate_and_what_is_missing() -> None:
    two = (camera("cam0", fps=10.25), camera("cam1", fps=19.5))
    assert (
        service_line(snapshot(serving=SERVING, cameras=two, broker=link()))
        == "serving demo 1.0.0 on onnxruntime: 2 camera(s) at 29.75 FPS; broker connected"
    )
    assert service_line(snapshot(bundle=None, broker=link(connected=False))) == "no model installed; broker unreachable"
    assert service_line(snapshot(cameras=())) == "serving demo 1.0.0: 0 camera(s) at 0 FPS", "no runtime yet"
    full = full_snapshot()
    assert service_line(full) == "cannot serve: parity 0.91 below 0.99; broker connected; governor WARM"
    assert service_line(dataclasses.replace(full, serving_error=None, serving=SERVING)).startswith(
        "serving demo 1.0.0 on onnxruntime: 2 camera(s) at 20.0 FPS;"
    )


def _controls() -> AgentControls:
    def never(*args: object) -> object:
        raise AssertionError("not called")

    return AgentControls(
        snapshot=snapshot, health=lambda: Health(True), rollback=never, restart=never, camera_jpeg=never, events=list
    )  # type: ignore[arg-type]


def test_no_page_unless_configured() -> None:
    made: list[AgentControls] = []

    def controls() -> AgentControls:
        made.append(_controls())
        return made[-1]

    assert start_page(None, controls) is None
    assert made == [], "the controls are not even made"


def test_the_page_serves_what_its_controls_answer() -> None:
    server = start_page(StatusPageSection(listen=f"127.0.0.1:{free_port()}"), _controls)
    assert server is not None
    try:
        answer = http(server.url + "api/status")
        assert answer.status == 200 and answer.json()["device"] == "cam-1"
        assert http(server.url + "healthz").status == 200
    finally:
        server.stop()


def test_a_page_that_cannot_start_is_logged_and_the_agent_serves_on(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.ERROR, "agent.daemon.page"):
            assert start_page(StatusPageSection(listen=f"127.0.0.1:{port}"), _controls) is None
    logged = [r.getMessage() for r in caplog.records if r.name == "agent.daemon.page"]
    assert len(logged) == 1 and logged[0].startswith("status page not served: ")
