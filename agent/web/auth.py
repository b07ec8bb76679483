"""Who may read the page and who may act: HTTP Basic checked in constant time, and actions
refused when they come from another site.

- Without credentials configured (the page then listens on loopback only, the config makes
  sure): reading is open, actions are refused (403): they need credentials.
- With credentials: every request but ``/healthz`` needs them (401 with a Basic challenge).
  The name and the password are compared with `hmac.compare_digest`, both, always, so the
  time taken says nothing about how much was right.
- Actions (any method but GET and HEAD) must come from the page itself: a browser sends
  ``Origin`` and ``Sec-Fetch-Site`` with a cross-site request, and a request whose origin is
  not this server's is refused (403) before anything runs, so a page on another site cannot
  use the technician's logged-in browser. Tools that send neither (curl) are let through.
- Every request but ``/healthz`` must name this device in its ``Host`` header (421
  ``WRONG_HOST`` otherwise): an IP address (a browser's origin is then that address itself),
  ``localhost``, the device's host name (also with ``.local``) or one of ``status_page.hosts``.
  A page on another site whose name was made to resolve to the device (DNS rebinding) sends its
  own name, so it can neither read the page nor pass the same-origin rule of the actions.

`Guard.refusal` is pure over the request's method, path, headers and scheme; `AccessMiddleware`
applies it to every request and adds the security headers to every response.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent.errors import ErrorCode, error_envelope

OPEN_PATHS = ("/healthz",)
READ_METHODS = ("GET", "HEAD")
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # no framing (the action buttons cannot be clickjacked), scripts and data from this server only
    "Content-Security-Policy": "default-src 'self'; img-src 'self' blob: data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'self'",
}


@dataclass(frozen=True)
class Refusal:
    status: int
    code: ErrorCode
    message: str

    def response(self) -> Response:
        body = json.dumps(error_envelope(self.code, self.message))
        headers = {"WWW-Authenticate": 'Basic realm="edge-agent", charset="UTF-8"'} if self.status == 401 else {}
        return Response(body, self.status, headers, media_type="application/json")


def host_name(host: str) -> str:
    """The name of a ``Host`` header without its port, lower case, without a final dot
    (``[::1]:8080`` -> ``::1``, ``Cam-1.local.:80`` -> ``cam-1.local``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def page_names(hostname: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The names a ``Host`` header may carry besides IP addresses: ``localhost``, the device's
    `hostname` with and without ``.local``, and `extra` (``status_page.hosts``)."""
    short = host_name(hostname).removesuffix(".local")
    return frozenset({"localhost", short, f"{short}.local", *(host_name(name) for name in extra)} - {""})


def is_own_host(host: str | None, names: frozenset[str]) -> bool:
    """True when ``Host`` is an IP address or one of `names` (`page_names`)."""
    name = host_name(host or "")
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return name in names
    return True


class Guard:
    """The access rules for `username` / `password` (both None: no credentials configured);
    with `hosts` (`page_names`), requests must name this device in ``Host``."""

    def __init__(self, username: str | None, password: str | None, hosts: frozenset[str] | None = None) -> None:
        if (username is None) != (password is None):
            raise ValueError("Guard: username and password go together")
        self._credentials = (username.encode(), password.encode()) if username and password is not None else None
        self._hosts = hosts

    def authenticated(self, authorization: str | None) -> bool:
        """True when the ``Authorization`` header carries the configured name and password."""
        if self._credentials is None:
            return False
        scheme, _, encoded = (authorization or "").partition(" ")
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True) if scheme.lower() == "basic" else b""
        except (binascii.Error, ValueError):
            decoded = b""
        user, _, password = decoded.partition(b":")
        user_ok = hmac.compare_digest(user, self._credentials[0])
        password_ok = hmac.compare_digest(password, self._credentials[1])
        return user_ok and password_ok

    def refusal(self, method: str, path: str, headers: Mapping[str, str], scheme: str) -> Refusal | None:
        """Why this request may not proceed, or None. `headers` are lower-case names."""
        if path in OPEN_PATHS:
            return None
        if self._hosts is not None and not is_own_host(headers.get("host"), self._hosts):
            return Refusal(
                421,
                ErrorCode.WRONG_HOST,
                "this page answers to the device's own names only (its addresses, host name, status_page.hosts)",
            )
        action = method not in READ_METHODS
        if self._credentials is not None and not self.authenticated(headers.get("authorization")):
            return Refusal(401, ErrorCode.UNAUTHORIZED, "this page needs the technician's user name and password")
        if not action:
            return None
        if self._credentials is None:
            return Refusal(
                403,
                ErrorCode.UNAUTHORIZED,
                "actions need credentials: set status_page.username and password_file in agent.yaml",
            )
        if cross_site(headers, scheme):
            return Refusal(403, ErrorCode.CROSS_SITE, "refused: this action was sent from another site")
        return None


def cross_site(headers: Mapping[str, str], scheme: str) -> bool:
    """True when a browser says the request comes from another origin than this server's."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return True
    origin = headers.get("origin")
    if origin is None:
        return False
    return origin != f"{scheme}://{headers.get('host', '')}"


class AccessMiddleware:
    """ASGI middleware: `guard` on every HTTP request, `SECURITY_HEADERS` on every response."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self.guard.refusal(scope["method"], scope["path"], headers, scope.get("scheme", "http"))

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                response_headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    response_headers.setdefault(name, value)
            await send(message)

        if refusal is not None:
            await refusal.response()(scope, receive, with_headers)
            return
        await self.app(scope, receive, with_headers)
