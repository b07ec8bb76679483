"""`StatusServer`: the status page served inside the daemon's process by uvicorn.

Threads: ``web`` runs uvicorn's event loop (the HTTP server; the endpoints' calls into the agent
run in its worker threads), ``web-history`` records a chart point every ``sample_s`` seconds.
The listening socket is bound in `start`, on the caller's thread, so an address in use or not
allowed fails there with an error naming ``status_page.listen``; TLS files and the password
are loaded there too. Nothing of the agent depends on the page: the daemon logs a page that
cannot start and serves on without it. `stop` closes the socket and joins both threads.

Bounds against clients that connect and say nothing (the red team held 1,100 idle connections
open until the daemon ran out of file descriptors and its sampler died): at most
``status_page.max_connections`` connections at once (`bounded_protocol`: one more closes the
longest-idle one, or itself when every one has a request in flight), and a connection that sends
nothing for ``status_page.idle_timeout_s`` is closed, from its first byte on as after a response
(uvicorn's keep-alive timeout begins only after a response). The page thus holds at most that
many descriptors and the rest of the process's limit stays the daemon's. asyncio's own accept
errors (EMFILE when the limit is reached all the same) are logged at most once a minute.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from agent.config.models import StatusPageSection
from agent.errors import ConfigError
from agent.throttle import ThrottleFilter
from agent.web.app import StatusApp
from agent.web.auth import Guard, page_names
from agent.web.controls import AgentControls
from agent.web.history import History
from agent.web.logs import RecentLogs
from pipelines.worker import DONE, Worker

log = logging.getLogger(__name__)

#: connections asyncio accepts at one wake-up and the kernel queues (uvicorn's ``backlog``, which
#: asyncio takes for both): uvicorn's 2048 let a flood take every descriptor before one connection could be
#: closed to make room
ACCEPT_BURST = 32


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port` (IPv4 or IPv6); raises `OSError` naming it."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise OSError(f"status_page.listen {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(ACCEPT_BURST)
    except OSError as exc:
        sock.close()
        raise OSError(f"status_page.listen {host}:{port}: cannot listen: {exc.strerror or exc}") from exc
    return sock


class BoundedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol for one connection, with the page's bounds (see the module
    text). `max_connections` is set on the subclass `bounded_protocol` makes; `accepted` and
    `evicted` count the connections taken and those closed to make room, for all of them. Runs on the
    ``web`` thread's event loop."""

    max_connections = 64
    accepted = 0
    evicted = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        type(self).accepted += 1
        self.active_at = self.loop.time()
        self._set_idle_timeout()
        if sum(1 for c in self.connections if not c.transport.is_closing()) > self.max_connections:
            self._make_room()

    def data_received(self, data: bytes) -> None:
        self.active_at = self.loop.time()
        super().data_received(data)
        if self.cycle is None or self.cycle.response_complete:  # a request still arriving, bytes apart
            self._set_idle_timeout()

    @property
    def idle(self) -> bool:
        """No request in flight: nothing would be cut off by closing it."""
        return self.cycle is None or self.cycle.response_complete

    def _set_idle_timeout(self) -> None:
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def _make_room(self) -> None:
        """Close the longest-idle other connection (one closing already does not count: a burst of
        accepts sees it until its close has run), or this one when every other is busy."""
        others = [
            c
            for c in self.connections
            if c is not self and isinstance(c, BoundedH11Protocol) and c.idle and not c.transport.is_closing()
        ]
        victim = min(others, key=lambda c: c.active_at) if others else self
        type(self).evicted += 1
        victim.transport.close()


def bounded_protocol(max_connections: int) -> type[BoundedH11Protocol]:
    """`BoundedH11Protocol` for one server, holding at most `max_connections` connections."""
    fields = {"max_connections": max_connections, "accepted": 0, "evicted": 0}
    return type("BoundedH11Protocol", (BoundedH11Protocol,), fields)


class QuietServer(uvicorn.Server):
    """uvicorn's server, its housekeeping tick once a second instead of ten times (the tick only
    refreshes the Date header and looks for the exit): an idle page costs a tenth of the wake-ups.
    `stop` takes up to a second."""

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864000  # a multiple of 10: the Date header is refreshed each time
            await asyncio.sleep(1.0)


class StatusServer:
    """The page for `controls` as `settings` (agent.yaml's ``status_page``) says. Raises
    `ConfigError` for a password that cannot be read."""

    def __init__(
        self,
        settings: StatusPageSection,
        controls: AgentControls,
        clock: Callable[[], float] = time.monotonic,
        hostname: str | None = None,
    ) -> None:
        """`clock` paces the actions (monotonic seconds); `hostname` is the device's name as the
        ``Host`` header may carry it (default: `socket.gethostname`)."""
        self.settings, self.controls = settings, controls
        self.history = History(points=int(settings.history_s / settings.sample_s) + 1)
        self.logs = RecentLogs()
        names = page_names(socket.gethostname() if hostname is None else hostname, settings.hosts)
        guard = Guard(settings.username, settings.password(), names)
        status_app = StatusApp(controls, guard, self.history, self.logs, clock)
        self._snapshot = status_app.snapshot  # shared with the page's requests
        app = status_app.asgi()
        tls = settings.tls
        self.protocol = bounded_protocol(settings.max_connections)
        self._config = uvicorn.Config(
            app,
            log_config=None,  # the daemon's logging stays as it is
            access_log=False,
            lifespan="off",
            server_header=False,
            timeout_graceful_shutdown=2,
            timeout_keep_alive=settings.idle_timeout_s,
            http=self.protocol,
            backlog=ACCEPT_BURST,
            ssl_certfile=str(tls.cert_file) if tls else None,
            ssl_keyfile=str(tls.key_file) if tls else None,
        )
        self._server = QuietServer(self._config)
        self._accept_errors = ThrottleFilter(every_s=60.0, clock=clock)  # an outsider can cause them
        self._socket: socket.socket | None = None
        self._workers = (
            Worker("web", self._serve, described="the status page's server", budget_s=None, monotonic=clock),
            Worker("web-history", self._sample, described="the status page's charts", budget_s=None, monotonic=clock),
        )

    @property
    def url(self) -> str:
        """Where the page is, as a browser on this device reaches it."""
        assert self._socket is not None, "not started"
        host, port = self._socket.getsockname()[:2]
        host = "127.0.0.1" if host == "0.0.0.0" else f"[{host}]" if ":" in host else host
        return f"{'https' if self.settings.tls else 'http'}://{host}:{port}/"

    def start(self) -> StatusServer:
        """Bind, load TLS, start both threads; raises `OSError` or `ConfigError` naming the
        setting that is wrong (nothing is left running then)."""
        try:
            self._config.load()
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"status_page.tls: cannot load the certificate or key: {exc}") from exc
        self._socket = listen_socket(self.settings.host, self.settings.port)
        logging.getLogger().addHandler(self.logs)
        logging.getLogger("asyncio").addFilter(self._accept_errors)
        for worker in self._workers:
            worker.start()
        log.info("status page on %s%s", self.url, "" if self.settings.has_credentials else " (read only)")
        return self

    def _serve(self) -> float | None:
        """uvicorn's server until `stop` (a failure: the worker starts it again after a wait)."""
        if self._socket is not None:
            self._server.run(sockets=[self._socket])
        return DONE

    def _sample(self) -> float:
        """A point of the charts (one that fails is missed; the page and the agent go on)."""
        self.history.record(self._snapshot())
        return self.settings.sample_s

    def stop(self) -> None:
        self._server.should_exit = True
        for worker in self._workers:
            worker.stop(5.0)
        logging.getLogger().removeHandler(self.logs)
        logging.getLogger("asyncio").removeFilter(self._accept_errors)
        if self._socket is not None:
            self._socket.close()
            self._socket = None
