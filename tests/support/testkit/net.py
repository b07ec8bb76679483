"""Network helpers of the tests and benchmarks: a free port, waiting for a condition, a TCP relay that
can cut its connections, an HTTP server with Range requests (and ways to misbehave)."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

#: Ports the tests hand out lie below the kernel's ephemeral range (32768-60999 by default), so a
#: client socket's source port never takes one between its choice and its server's bind; each
#: pytest-xdist worker has a block of its own, so parallel workers never choose the same one.
PORT_BASE, PORT_BLOCK, PORT_BLOCKS = 12000, 2000, 10
_next_port: list[int] = []  # this process's cursor in its block (a list: set on first use)


def _worker_index() -> int:
    """pytest-xdist's worker number (`gw3` -> 3), 0 outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw") or 0) % PORT_BLOCKS


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports on 127.0.0.1, from this worker's block of `PORT_BLOCK` ports.

    Ports are handed out in turn from a random start (a child process of the same worker starts
    elsewhere in the block), and one is taken only if a plain bind (without SO_REUSEADDR) succeeds
    on it now, so a port still in use or in TIME_WAIT is passed over."""
    first = PORT_BASE + _worker_index() * PORT_BLOCK
    if not _next_port:
        _next_port.append(random.randrange(PORT_BLOCK))
    chosen: list[int] = []
    for _ in range(PORT_BLOCK):
        port = first + _next_port[0] % PORT_BLOCK
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
        if len(chosen) == count:
            return chosen
    raise AssertionError(f"no {count} free ports left in {first}-{first + PORT_BLOCK - 1}")


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class TcpProxy:
    """A TCP relay from a free port to `target_port`: `cut()` drops every connection and refuses
    new ones (a network cut as the device sees it), `restore()` listens again.

    `limit(n, then)` bounds what reaches the client side from now on to exactly `n` more bytes,
    counted by the relay itself (so a test can cut a transfer in its middle without racing it):
    then it cuts every connection (``"cut"``) or holds the rest back (``"hold"``: the connections
    stay open, nothing more is forwarded toward the client) until `unlimit()`. `held` tells
    whether the budget is spent. A cut ends the limit and drops what was held back."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.port = target_port, free_port()
        self._lock = threading.Condition()
        self._sockets: list[socket.socket] = []
        self._server: socket.socket | None = None
        self._budget: int | None = None  # bytes toward the client still allowed; None: no limit
        self._then: Literal["cut", "hold"] = "cut"
        self.held = False
        self.cuts = 0  # cut() calls so far (a held pump gives up when one comes)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def restore(self) -> TcpProxy:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen()
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()
        return self

    def limit(self, to_client: int, then: Literal["cut", "hold"]) -> None:
        with self._lock:
            self._budget, self._then, self.held = to_client, then, False

    def unlimit(self) -> None:
        with self._lock:
            self._budget, self.held = None, False
            self._lock.notify_all()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _allowed(self, data: bytes) -> tuple[bytes, bytes]:
        """What of `data` (bound for the client) may go now, and what must wait or be dropped."""
        with self._lock:
            if self._budget is None:
                return data, b""
            now, later = data[: self._budget], data[self._budget :]
            self._budget -= len(now)
            if later:
                self.held = True
            return now, later

    def _wait_for_release(self) -> bool:
        """Block a held pump until `unlimit()` (True: send what it holds) or a cut (False: what it
        holds is dropped, as a cut network drops it; the cut closes its sockets)."""
        with self._lock:
            cuts = self.cuts
            self._lock.wait_for(lambda: self._budget is None or self.cuts != cuts)
            return self.cuts == cuts

    def _pump(self, source: socket.socket, sink: socket.socket, to_client: bool) -> None:
        try:
            while data := source.recv(65536):
                if not to_client:
                    sink.sendall(data)
                    continue
                now, later = self._allowed(data)
                sink.sendall(now)
                if later and self._then == "cut":
                    self.cut()
                    return
                if later:
                    if not self._wait_for_release():
                        break  # a cut while held: dropped (cut() may not have closed the sockets yet)
                    sink.sendall(later)
        except OSError:
            pass
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (close alone does not)
            self._server.close()
            self._server = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
            self._budget, self.held = None, False
            self.cuts += 1
            self._lock.notify_all()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


class RangeServer:
    """HTTP on a free port serving one file with Range support (206). `drop_after` closes the
    connection after that many requests once (a flaky link); `ignore_range` answers 200;
    `unavailable` answers that many requests 503 before serving (an overloaded server); `cut_at`
    sends the first ranged answer starting at that offset only half its body, then closes (a
    connection dropped mid-chunk); `drip` makes answers starting at or after `drip_from` send
    100 bytes each time the test releases the semaphore (a server dripping bytes, paced by the
    test instead of a clock). `state["dripped"]` counts the pieces sent."""

    def __init__(
        self,
        path: Path,
        drop_after: int | None = None,
        ignore_range: bool = False,
        unavailable: int = 0,
        cut_at: int | None = None,
        drip: threading.Semaphore | None = None,
        drip_from: int = 0,
    ) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        data, server_state = path.read_bytes(), {"requests": 0, "dropped": False, "cut": False, "dripped": 0}
        self.state, closing = server_state, threading.Event()
        self._closing = closing

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server_state["requests"] += 1
                if self.path != "/" + path.name:
                    self.send_error(404)
                    return
                if server_state["requests"] <= unavailable:
                    self.send_error(503)
                    return
                if drop_after is not None and server_state["requests"] > drop_after and not server_state["dropped"]:
                    server_state["dropped"] = True
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                ranged = self.headers.get("Range", "")
                if ranged.startswith("bytes=") and not ignore_range:
                    first, last = (int(v) for v in ranged[6:].split("-"))
                    body = data[first : last + 1]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {first}-{first + len(body) - 1}/{len(data)}")
                else:
                    body = data
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                first = int(ranged[6:].split("-")[0]) if ranged.startswith("bytes=") else 0
                if cut_at == first and not server_state["cut"]:
                    server_state["cut"] = True
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if drip is not None and first >= drip_from:
                    for start in range(0, len(body), 100):
                        while not drip.acquire(timeout=0.05):
                            if closing.is_set():
                                return
                        self.wfile.write(body[start : start + 100])
                        self.wfile.flush()
                        server_state["dripped"] += 1
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{path.name}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        self.server.shutdown()
        self.server.server_close()
