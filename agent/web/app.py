"""The status page's HTTP application (Starlette): the page, ``/api``, ``/metrics``, ``/healthz``.

Routes (docs/status-page.md has every field):

- ``GET /``: the page (``static/index.html``; its script, styles and the uPlot chart library
  are served from ``/static``, nothing from the internet);
- ``GET /api/status``: the agent snapshot (`AgentSnapshot.to_json`);
- ``GET /api/problems``: health and the problem list, failures first;
- ``GET /api/history?since=TS``: the chart points newer than ``TS`` (Unix seconds);
- ``GET /api/events``, ``GET /api/logs``: recent events and log lines, oldest first;
- ``GET /api/events/<object_id>/snapshot``, ``.../clip``: an event's kept snapshot (JPEG) or
  clip (MP4), 404 ``NO_MEDIA`` when none is kept; an id that is not 16 hex digits is 404
  before anything is read (no path reaches the disk);
- ``GET /api/cameras/<name>/snapshot.jpg?quality=Q``: the camera's newest frame, annotated
  (``Q`` from 1 to 100; anything else is 400 ``BAD_PAYLOAD``);
- ``POST /api/rollback``, ``POST /api/cameras/<name>/restart``: the technician's actions, paced
  (`PACES`: past it, 429 ``BUSY`` with ``Retry-After``) and logged as audit lines;
- ``GET /metrics``: Prometheus text format; ``GET /healthz``: 200 or 503 with the reasons.

Access rules are `agent.web.auth.AccessMiddleware`'s. Endpoints run on the server's event loop
and call the agent (`AgentControls`) in worker threads, since a snapshot may wait for the
cameras' lock during an activation: one lane for reads and one for actions, a thread each at
most (a page polling in a browser then keeps one thread, and its memory, busy, not a pool's
worth; a rollback waiting for a deployment step never holds up ``/healthz``). One poll of the
page (status, problems, history) reads the agent once: a snapshot is reused for up to
`SNAPSHOT_REUSE_S` (`RecentSnapshot`), and forgotten after an action, so the page shows what
the action did.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agent.errors import CodedError, ErrorCode, error_envelope
from agent.snapshot import AgentSnapshot
from agent.throttle import ThrottledLog, TokenBucket
from agent.web.auth import AccessMiddleware, Guard
from agent.web.controls import AgentControls
from agent.web.history import History
from agent.web.logs import AUDIT, RecentLogs
from agent.web.metrics import metrics_registry
from agent.web.problems import page_problems

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
NO_STORE = {"Cache-Control": "no-store"}
#: an event's id (`agent.serving.events`): the only ids the media routes look up
EVENT_ID = re.compile(r"[0-9a-f]{16}")
SNAPSHOT_REUSE_S = 1.0  # seconds a snapshot serves the requests of one poll
T = TypeVar("T")
#: HTTP status of each error an action or a read may raise
STATUS_OF = {
    ErrorCode.NO_PREVIOUS: 409,
    ErrorCode.BUSY: 503,
    ErrorCode.NO_PIPELINE: 404,
    ErrorCode.NO_FRAME: 503,
}


def _error(exc: CodedError) -> JSONResponse:
    return JSONResponse(error_envelope(exc.code, exc.message), STATUS_OF.get(exc.code, 500), NO_STORE)


class BadQuery(ValueError):
    """A query parameter that is not a number in its range (400 ``BAD_PAYLOAD``)."""


def _number(request: Request, name: str, default: float, low: float, high: float) -> float:
    """The query parameter `name` as a finite number in [`low`, `high`] (`default` when absent);
    raises `BadQuery` naming it otherwise (``nan``, ``inf``, ``abc``, out of range)."""
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and low <= value <= high):
        raise BadQuery(f"{name} must be a number from {low:g} to {high:g}, not {text[:32]!r}")
    return value


def _bad_query(exc: BadQuery) -> JSONResponse:
    return JSONResponse(error_envelope(ErrorCode.BAD_PAYLOAD, str(exc)), 400, NO_STORE)


@dataclass(frozen=True)
class Pace:
    """How often a page action may run: `burst` at once, then one per `every_s` seconds."""

    burst: int
    every_s: float


#: the pace of each page action (a technician clicks; a script holding the password cannot
#: restart a camera 200 times in a row or roll back and forth)
PACES = {
    "rollback": Pace(burst=2, every_s=30.0),
    "restart": Pace(burst=5, every_s=5.0),
    "accept-view": Pace(burst=5, every_s=5.0),
}


class RecentSnapshot:
    """`read` (the agent's snapshot), reused while younger than `max_age_s` seconds of `clock`
    (any thread)."""

    def __init__(
        self, read: Callable[[], AgentSnapshot], max_age_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._read, self._max_age_s, self._clock = read, max_age_s, clock
        self._lock = threading.Lock()
        self._kept: tuple[float, AgentSnapshot] | None = None

    def __call__(self) -> AgentSnapshot:
        with self._lock:
            now = self._clock()
            if self._kept is None or now - self._kept[0] > self._max_age_s:
                self._kept = (now, self._read())
            return self._kept[1]

    def forget(self) -> None:
        with self._lock:
            self._kept = None


class StatusApp:
    """The endpoints over `controls`, `history` and `logs`, behind `guard`; the actions paced as
    `PACES` says on `clock` (monotonic seconds)."""

    def __init__(
        self,
        controls: AgentControls,
        guard: Guard,
        history: History,
        logs: RecentLogs,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.controls, self.guard, self.history, self.logs = controls, guard, history, logs
        self.snapshot = RecentSnapshot(controls.snapshot, SNAPSHOT_REUSE_S)
        # the endpoints run on the event loop, one at a time: the buckets need no lock
        self._paces = {name: TokenBucket(1 / pace.every_s, pace.burst, clock) for name, pace in PACES.items()}
        self._throttled = ThrottledLog(log, clock=clock)
        self._registry = metrics_registry(self.snapshot, controls.health)
        self._lanes: dict[str, anyio.CapacityLimiter] = {}  # made on the event loop, at first use

    async def _in(self, lane: str, func: Callable[..., T], *args: Any) -> T:
        """`func(*args)` in the worker thread of `lane` (``read`` or ``act``)."""
        if lane not in self._lanes:
            self._lanes[lane] = anyio.CapacityLimiter(1)
        return await anyio.to_thread.run_sync(func, *args, limiter=self._lanes[lane])

    def asgi(self) -> Starlette:
        routes = [
            Route("/", self.page),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            Route("/api/status", self.status),
            Route("/api/problems", self.problems),
            Route("/api/history", self.history_points),
            Route("/api/events", self.events),
            Route("/api/logs", self.log_lines),
            Route("/api/samples", self.samples),
            Route("/api/events/{event_id}/{kind}", self.event_media),
            Route("/api/cameras/{name}/snapshot.jpg", self.camera_jpeg),
            Route("/api/rollback", self.rollback, methods=["POST"]),
            Route("/api/cameras/{name}/restart", self.restart, methods=["POST"]),
            Route("/api/cameras/{name}/reference.jpg", self.camera_reference),
            Route("/api/cameras/{name}/accept-view", self.accept_view, methods=["POST"]),
            Route("/metrics", self.metrics),
            Route("/healthz", self.healthz),
        ]
        return Starlette(routes=routes, middleware=[Middleware(AccessMiddleware, guard=self.guard)])

    # -- reading -------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def status(self, request: Request) -> Response:
        document = await self._in("read", lambda: self.snapshot().to_json())
        return JSONResponse(document, headers=NO_STORE)

    async def problems(self, request: Request) -> Response:
        snapshot, health = await self._in("read", lambda: (self.snapshot(), self.controls.health()))
        found = page_problems(snapshot, health, self.history.reference_fps(time.time()))
        body = {"health": asdict(health), "problems": [f.to_json() for f in found]}
        return JSONResponse(body, headers=NO_STORE)

    async def history_points(self, request: Request) -> Response:
        try:
            since = _number(request, "since", 0.0, 0.0, 1e12)
        except BadQuery as exc:
            return _bad_query(exc)
        return JSONResponse(self.history.to_json(since), headers=NO_STORE)

    async def events(self, request: Request) -> Response:
        events = await self._in("read", self.controls.events)
        return JSONResponse([event.to_json() for event in events], headers=NO_STORE)

    async def log_lines(self, request: Request) -> Response:
        return JSONResponse(self.logs.to_json(), headers=NO_STORE)

    async def samples(self, request: Request) -> Response:
        """The samples for retraining kept per camera (``{}``: no camera keeps samples)."""
        if self.controls.samples is None:
            return JSONResponse({}, headers=NO_STORE)
        kept = await self._in("read", self.controls.samples)
        return JSONResponse({name: value.to_json() for name, value in kept.items()}, headers=NO_STORE)

    async def event_media(self, request: Request) -> Response:
        event_id, kind = request.path_params["event_id"], request.path_params["kind"]
        found = None
        if EVENT_ID.fullmatch(event_id) and kind in ("snapshot", "clip") and self.controls.media is not None:
            found = await self._in("read", self.controls.media, event_id, kind)
        if found is None:
            message = "no snapshot or clip of that event is kept here (gone by retention, or never made)"
            return JSONResponse(error_envelope(ErrorCode.NO_MEDIA, message), 404, NO_STORE)
        data, content_type = found
        return Response(data, media_type=content_type, headers=NO_STORE)

    async def camera_jpeg(self, request: Request) -> Response:
        try:
            quality = round(_number(request, "quality", 80, 1, 100))
        except BadQuery as exc:
            return _bad_query(exc)
        try:
            jpeg = await self._in("read", self.controls.camera_jpeg, request.path_params["name"], quality)
        except CodedError as exc:
            return _error(exc)
        return Response(jpeg, media_type="image/jpeg", headers=NO_STORE)

    async def camera_reference(self, request: Request) -> Response:
        """The camera's health reference image (JPEG, the check's small grey copy): what "moved"
        compares the live view with."""
        if self.controls.camera_reference is None:
            return _error(CodedError(ErrorCode.NO_PIPELINE, "this agent checks no camera's health"))
        try:
            jpeg = await self._in("read", self.controls.camera_reference, request.path_params["name"])
        except CodedError as exc:
            return _error(exc)
        return Response(jpeg, media_type="image/jpeg", headers=NO_STORE)

    async def metrics(self, request: Request) -> Response:
        body = await self._in("read", generate_latest, self._registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def healthz(self, request: Request) -> Response:
        health = await self._in("read", self.controls.health)
        return JSONResponse(asdict(health), 200 if health.ok else 503, NO_STORE)

    # -- acting (POST only, authenticated and same-origin: see agent.web.auth) ------------------

    def _too_soon(self, action: str, request: Request) -> Response | None:
        """The 429 answer when `action` ran too often lately (see `PACES`), else None."""
        bucket = self._paces[action]
        if bucket.take():
            return None
        wait = max(1, math.ceil(bucket.retry_after()))
        pace = PACES[action]
        self._throttled.warning(action, "status page: %s from %s refused: asked too often", action, _client(request))
        message = f"too many {action}s: {pace.burst} at once, then one per {pace.every_s:g} s; try again in {wait} s"
        return JSONResponse(error_envelope(ErrorCode.BUSY, message), 429, {**NO_STORE, "Retry-After": str(wait)})

    async def rollback(self, request: Request) -> Response:
        refused = self._too_soon("rollback", request)
        if refused is not None:
            return refused
        log.warning("status page: rollback requested from %s", _client(request), extra=AUDIT)
        try:
            deployment = await self._in("act", self.controls.rollback)
        except CodedError as exc:
            log.warning("status page: rollback refused: %s", exc, extra=AUDIT)
            return _error(exc)
        self.snapshot.forget()
        return JSONResponse({"ok": True, "deployment": asdict(deployment)}, headers=NO_STORE)

    async def restart(self, request: Request) -> Response:
        refused = self._too_soon("restart", request)
        if refused is not None:
            return refused
        name = request.path_params["name"]
        log.warning("status page: restart of camera %r requested from %s", name[:64], _client(request), extra=AUDIT)
        try:
            restarted = await self._in("act", self.controls.restart, name)
        except CodedError as exc:
            return _error(exc)
        finally:
            self.snapshot.forget()
        return JSONResponse({"ok": True, "restarted": restarted}, headers=NO_STORE)

    async def accept_view(self, request: Request) -> Response:
        """The camera's next frame becomes its health reference ("accept the new view": a camera
        moved on purpose is no longer reported as moved)."""
        refused = self._too_soon("accept-view", request)
        if refused is not None:
            return refused
        name = request.path_params["name"]
        log.warning("status page: new view of camera %r accepted from %s", name[:64], _client(request), extra=AUDIT)
        if self.controls.accept_view is None:
            return _error(CodedError(ErrorCode.NO_PIPELINE, "this agent checks no camera's health"))
        try:
            await self._in("act", self.controls.accept_view, name)
        except CodedError as exc:
            return _error(exc)
        return JSONResponse({"ok": True, "camera": name}, headers=NO_STORE)


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "an unknown client"
