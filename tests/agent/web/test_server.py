"""`agent.web.server`: the page's bounds against clients that connect and say nothing, over real
sockets: a silent connection is closed after ``idle_timeout_s``, one connection past
``max_connections`` closes the longest-idle one, and a new client is still answered; a request
whose announced body never comes holds no slot either (the page answers before reading one)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from testkit.net import free_port, wait_until
from testkit.page import http
from testkit.snapshots import snapshot

from agent.config.models import StatusPageSection
from agent.snapshot import Health
from agent.web.controls import AgentControls
from agent.web.server import StatusServer


def _controls() -> AgentControls:
    def nothing(*args: object) -> object:
        raise AssertionError("not asked for")

    return AgentControls(
        snapshot=snapshot,
        health=lambda: Health(True),
        rollback=nothing,  # type: ignore[arg-type]
        restart=nothing,  # type: ignore[arg-type]
        camera_jpeg=nothing,  # type: ignore[arg-type]
        events=list,
    )


@pytest.fixture
def server() -> Iterator[StatusServer]:
    section = StatusPageSection(listen=f"127.0.0.1:{free_port()}", max_connections=4, idle_timeout_s=1)
    page = StatusServer(section, _controls()).start()
    yield page
    page.stop()


def closed_by_the_server(connection: socket.socket) -> bool:
    """The server closed `connection` (end of stream waiting); False while it is open and silent."""
    try:
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:  # nothing to read: open
        return False
    except ConnectionResetError:
        return True


def connect(server: StatusServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    connection = socket.create_connection((host, int(port)), timeout=5)
    connection.settimeout(None)  # blocking: a MSG_DONTWAIT peek answers at once
    return connection


def test_a_connection_that_says_nothing_is_closed_after_the_idle_timeout(server: StatusServer) -> None:
    silent = connect(server)
    try:
        wait_until(lambda: closed_by_the_server(silent), 15, "the page to close the silent connection")
    finally:
        silent.close()
    assert http(server.url + "healthz").status == 200


def test_one_connection_past_the_bound_closes_the_longest_idle_one() -> None:
    section = StatusPageSection(listen=f"127.0.0.1:{free_port()}", max_connections=4, idle_timeout_s=300)
    page = StatusServer(section, _controls()).start()
    held = [connect(page)]
    try:
        wait_until(lambda: page.protocol.accepted >= 1, 10, "the first connection accepted")
        held += [connect(page) for _ in range(3)]
        wait_until(lambda: page.protocol.accepted >= 4, 10, "four connections accepted")
        assert not any(closed_by_the_server(c) for c in held), "four fit"
        held.append(connect(page))
        wait_until(lambda: closed_by_the_server(held[0]), 10, "the oldest idle connection closed")
        assert not any(closed_by_the_server(c) for c in held[1:]), "only the oldest"
        assert page.protocol.evicted == 1
        assert http(page.url + "healthz").status == 200, "a new client is answered (another idle one makes room)"
        assert page.protocol.evicted == 2
    finally:
        for connection in held:
            connection.close()
        page.stop()


def stalled_request(server: StatusServer) -> socket.socket:
    """A connection that sent a request's headers, promised a body and sent none of it, with the
    page's answer (the read-only page refuses an action at once) read off it."""
    connection = connect(server)
    head = "POST /api/rollback HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 64\r\n\r\n"
    connection.sendall(head.encode())
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
        answer += connection.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    return connection


def test_a_request_whose_body_never_comes_is_closed_after_the_idle_timeout(server: StatusServer) -> None:
    stalled = stalled_request(server)
    try:
        wait_until(lambda: closed_by_the_server(stalled), 15, "the page to close the stalled request")
    finally:
        stalled.close()
    assert http(server.url + "healthz").status == 200


def test_stalled_requests_in_every_slot_make_room_for_a_new_client() -> None:
    section = StatusPageSection(listen=f"127.0.0.1:{free_port()}", max_connections=4, idle_timeout_s=300)
    page = StatusServer(section, _controls()).start()
    held: list[socket.socket] = []
    try:
        for count in range(1, 5):
            held.append(stalled_request(page))
            wait_until(lambda n=count: page.protocol.accepted >= n, 10, f"connection {count} accepted")
        assert http(page.url + "healthz").status == 200, "a stalled request is not a busy one"
        assert page.protocol.evicted == 1
        wait_until(lambda: closed_by_the_server(held[0]), 10, "the longest-stalled request closed to make room")
        assert not any(closed_by_the_server(c) for c in held[1:]), "only the longest-stalled one"
    finally:
        for connection in held:
            connection.close()
        page.stop()
