"""A real mosquitto broker on a free port, and a client that watches what it carries."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from testkit.needs import missing
from testkit.net import free_port, wait_until

#: the largest packet the `small_broker` fixture's mosquitto takes (64 KiB)
SMALL_PACKET = 65536

MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)


class Broker:
    """mosquitto on a free port of 127.0.0.1, its config and log in `folder`: `listener` holds the
    listener's options (anonymous by default), `extra` more lines for its config; with
    `persistence` (the tests' default) retained messages survive a restart (autosaved every
    second), without it (the benchmarks') nothing is written; `nodelay` sets TCP_NODELAY."""

    def __init__(
        self,
        folder: Path,
        extra: str = "",
        listener: str = "allow_anonymous true\n",
        persistence: bool = True,
        nodelay: bool = True,
    ) -> None:
        if MOSQUITTO is None:
            missing("mosquitto", "mosquitto is not installed (apt-get install mosquitto)")
        self.folder, self.port = folder, free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.conf = folder / "mosquitto.conf"
        user = pwd.getpwuid(os.geteuid()).pw_name
        if persistence:
            stored = f"persistence true\npersistence_location {folder}/\nautosave_interval 1\n"
        else:
            stored = "persistence false\n"
        self.conf.write_text(
            f"user {user}\nper_listener_settings true\nlistener {self.port} 127.0.0.1\n{listener}{stored}"
            f"set_tcp_nodelay {'true' if nodelay else 'false'}\n"
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
