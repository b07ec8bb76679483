"""A real mosquitto broker per test, the agent as a real process, and a watching MQTT client."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import yaml
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from tests.conftest import REPO
from tests.needs import missing

MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Broker:
    """mosquitto on a free port with persistence in `folder`; `listener` holds the listener's
    options (anonymous by default), `extra` more lines for its config."""

    def __init__(self, folder: Path, extra: str = "", listener: str = "allow_anonymous true\n") -> None:
        if MOSQUITTO is None:
            missing("mosquitto", "mosquitto is not installed (apt-get install mosquitto)")
        self.folder, self.port = folder, free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.conf = folder / "mosquitto.conf"
        user = pwd.getpwuid(os.geteuid()).pw_name
        self.conf.write_text(
            f"user {user}\nper_listener_settings true\nlistener {self.port} 127.0.0.1\n{listener}"
            f"persistence true\npersistence_location {folder}/\nautosave_interval 1\nset_tcp_nodelay true\n"
            f"log_dest file {folder}/mosquitto.log\nlog_type error\nlog_type warning\n{extra}"
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> Broker:
        self.process = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stderr=subprocess.PIPE)

        def accepting() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"mosquitto exited: {self.process.stderr.read().decode()}")  # type: ignore[union-attr]
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0

        wait_until(accepting, 10, "mosquitto to listen")
        return self

    def kill(self) -> None:
        """SIGKILL: what it persisted at its last autosave (every second) survives."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


class Watcher:
    """A test's own MQTT client: records every message on `filters` (newest per topic too)."""

    def __init__(self, broker: Broker, filters: list[str]) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.latest: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._token = os.urandom(16).hex().encode()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_connect = lambda c, *_: c.subscribe([(f, 1) for f in filters])
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()
        assert subscribed.wait(10), "the watcher could not subscribe"

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        if message.payload == self._token:
            self._synced.set()
            return
        with self._lock:
            self.messages.append(message)
            self.latest[message.topic] = bytes(message.payload)

    def json(self, topic: str) -> Any:
        with self._lock:
            payload = self.latest.get(topic)
        return json.loads(payload) if payload else None

    def wait_json(self, topic: str, predicate: Callable[[Any], bool], timeout: float = 60) -> Any:
        def match() -> Any:
            document = self.json(topic)
            return document if document is not None and predicate(document) else None

        return wait_until(match, timeout, f"{topic} to match")

    def sync(self, topic: str, timeout: float = 10) -> None:
        """Return once every message the broker sent before now has arrived (the retained ones
        after subscribing too): publish a marker to `topic`, which the filters must match, and
        wait for it to come back. The marker is not recorded."""
        self._synced.clear()
        self.client.publish(topic, self._token, qos=1)
        assert self._synced.wait(timeout), f"the marker on {topic} did not come back"

    def all_json(self, topic: str) -> list[Any]:
        with self._lock:
            return [json.loads(m.payload) for m in self.messages if m.topic == topic and m.payload]

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def agent_config(
    tmp: Path,
    broker: Broker,
    device: str,
    trust_key: Path | None,
    group: str | None = None,
    operator_key: Path | None = None,
    **overrides: Any,
) -> Path:
    """Write an agent.yaml for a test device with the synthetic camera; returns its path.
    Without `operator_key` the device obeys unsigned control."""
    config: dict[str, Any] = {
        "device": {"id": device, **({"group": group} if group else {})},
        "state_dir": str(tmp / device / "state"),
        "trust_keys": [str(trust_key)] if trust_key else [],
        "allow_unsigned": trust_key is None,
        "operator_keys": [str(operator_key)] if operator_key else [],
        "allow_unsigned_control": operator_key is None,
        "mqtt": {"broker": broker.url, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "pipelines": [{"name": "cam0", "source": "synthetic", "max_fps": 10}],
        # the fleet tests time transfers (autotune measures at each activation; test_matrix.py tests it)
        "deployments": {"autotune": False, "probation_s": 1.0},
        "telemetry": {"interval_s": 0.5},
        "events": {"min_interval_s": 1.0},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    path = tmp / device / "agent.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


class AgentProcess:
    """``edge-agent run`` in its own process, logging to a file next to its config."""

    def __init__(self, config: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()) -> None:
        """`args` go after ``run --config FILE`` (``("--root", tree)``)."""
        self.config, self.log = config, config.with_suffix(".log")
        self.env = {**os.environ, **(env or {})}
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "agent.cli", "-v", "run", "--config", str(self.config), *self.args],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                raise AssertionError(f"the agent did not stop within {timeout} s:\n{self.output()}") from None
        return self.process.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class TcpProxy:
    """A TCP relay from a free port to `target_port`: `cut()` drops every connection and refuses
    new ones (a network cut as the device sees it), `restore()` listens again."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.port = target_port, free_port()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._server: socket.socket | None = None

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
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
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
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


class RangeServer:
    """HTTP on a free port serving one file with Range support (206). `drop_after` closes the
    connection after that many requests once (a flaky link); `ignore_range` answers 200;
    `unavailable` answers that many requests 503 before serving (an overloaded server)."""

    def __init__(
        self, path: Path, drop_after: int | None = None, ignore_range: bool = False, unavailable: int = 0
    ) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        data, server_state = path.read_bytes(), {"requests": 0, "dropped": False}
        self.state = server_state

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
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/{path.name}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
