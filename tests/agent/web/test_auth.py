"""`agent.web.auth`: HTTP Basic, who may read and act, cross-site requests."""

from __future__ import annotations

import base64

import pytest

from agent.web.auth import Guard, cross_site


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("authorization", "ok"),
    [
        (header("tech", "pa:ss"), True),  # a colon in the password belongs to it
        (header("tech", "pa:s"), False),
        (header("tech", "pa:ss "), False),
        (header("Tech", "pa:ss"), False),
        (header("", "pa:ss"), False),
        ("Bearer " + base64.b64encode(b"tech:pa:ss").decode(), False),
        ("Basic not*base64", False),
        ("Basic", False),
        (None, False),
    ],
)
def test_basic_credentials(authorization: str | None, ok: bool) -> None:
    assert Guard("tech", "pa:ss").authenticated(authorization) is ok


@pytest.mark.parametrize(
    ("credentials", "method", "path", "headers", "refused"),
    [
        (False, "GET", "/api/status", {}, None),  # read only, open on loopback
        (False, "POST", "/api/rollback", {}, 403),  # actions need credentials
        (True, "GET", "/api/status", {}, 401),
        (True, "GET", "/metrics", {}, 401),
        (True, "GET", "/healthz", {}, None),  # probes
        (True, "GET", "/api/status", {"authorization": header("tech", "pw")}, None),
        (True, "POST", "/api/rollback", {"authorization": header("tech", "pw")}, None),
        (True, "POST", "/api/rollback", {"authorization": header("tech", "pw"), "origin": "http://evil"}, 403),
        (True, "POST", "/api/rollback", {"authorization": header("tech", "nope"), "origin": "http://evil"}, 401),
    ],
)
def test_who_may_read_and_act(
    credentials: bool, method: str, path: str, headers: dict[str, str], refused: int | None
) -> None:
    guard = Guard("tech", "pw") if credentials else Guard(None, None)
    refusal = guard.refusal(method, path, {"host": "10.0.0.5:8080", **headers}, "http")
    assert (refusal.status if refusal else None) == refused


@pytest.mark.parametrize(
    ("headers", "scheme", "is_cross"),
    [
        ({}, "http", False),  # curl and friends send neither header
        ({"origin": "http://10.0.0.5:8080"}, "http", False),
        ({"origin": "https://10.0.0.5:8080"}, "https", False),
        ({"origin": "http://10.0.0.5:8080"}, "https", True),
        ({"origin": "http://10.0.0.5:8081"}, "http", True),
        ({"origin": "null"}, "http", True),
        ({"sec-fetch-site": "same-origin", "origin": "http://10.0.0.5:8080"}, "http", False),
        ({"sec-fetch-site": "none"}, "http", False),
        ({"sec-fetch-site": "same-site"}, "http", True),
        ({"sec-fetch-site": "cross-site"}, "http", True),
    ],
)
def test_cross_site_requests(headers: dict[str, str], scheme: str, is_cross: bool) -> None:
    assert cross_site({"host": "10.0.0.5:8080", **headers}, scheme) is is_cross
