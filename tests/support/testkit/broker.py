"""A real mosquitto broker on a free port, and a client that watches what it carries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from agent.fleet.local_broker import MOSQUITTO, LocalBroker
from testkit.needs import missing
from testkit.net import free_port, wait_until

#: the largest packet the `small_broker` fixture's mosquitto takes (64 KiB)
SMALL_PACKET = 65536


class Broker(LocalBroker):
    """`LocalBroker` (agent/fleet/local_broker.py, which the demo's simulated fleet starts from the
    plain install too) on a port of this worker's block (`free_port`), with `persistence` on by
    default (the benchmarks turn it off); without mosquitto the test skips, or fails where
    ``EDGE_AGENT_REQUIRE`` names it."""

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
        super().__init__(folder, free_port(), extra, listener, persistence, nodelay)

    def start(self, timeout_s: float = 10.0) -> Broker:
        super().start(timeout_s)
        return self


MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"


def secured_broker(folder: Path, users: dict[str, str], acl: str) -> Broker:
    """A started `Broker` as docs/security.md sets one up: no anonymous clients, `users` (name ->
    password) in a password file, the `acl` text (`fleet acl`'s) as its ACL file, client ids
    tied to user names. Rewrite ``folder / "edge-agent.acl"`` and send its process SIGHUP to reload it."""
    if not Path(MOSQUITTO_PASSWD).exists():
        missing("mosquitto_passwd", "mosquitto_passwd is not installed (apt-get install mosquitto)")
    folder.mkdir(parents=True, exist_ok=True)
    passwd, acl_file = folder / "passwd", folder / "edge-agent.acl"
    for i, (user, password) in enumerate(users.items()):
        subprocess.run([MOSQUITTO_PASSWD, *(["-c"] if i == 0 else []), "-b", str(passwd), user, password], check=True)
    acl_file.write_text(acl)
    for path in (passwd, acl_file):
        path.chmod(0o600)
    listener = f"allow_anonymous false\npassword_file {passwd}\nacl_file {acl_file}\nuse_username_as_clientid true\n"
    return Broker(folder, listener=listener).start()


MOSQUITTO_CTRL = shutil.which("mosquitto_ctrl") or "/usr/bin/mosquitto_ctrl"
DYNSEC_PLUGIN = Path("/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so")
#: the dynamic security broker's operator: the plugin's admin role, and everything under edge/
DYNSEC_OPERATOR = ("operator", "operator-password")


def dynsec_broker(folder: Path) -> Broker:
    """A started `Broker` with mosquitto's dynamic security plugin loaded and no anonymous
    clients: ``dynamic-security.json`` made by ``mosquitto_ctrl dynsec init`` (user ``admin``),
    and the user `DYNSEC_OPERATOR` with the plugin's ``admin`` role and ``edge-operator`` (write
    ``edge/#``; ``admin`` reads everything), as docs/fleet.md#enrolment sets up an operator."""
    from agent.config.models import MqttSection
    from agent.fleet.client import connect
    from agent.fleet.enrolments import Dynsec

    for tool in (Path(MOSQUITTO_CTRL), DYNSEC_PLUGIN):
        if not tool.exists():
            missing("mosquitto-dynsec", f"{tool} is not installed (apt-get install mosquitto mosquitto-clients)")
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "dynamic-security.json"
    init = [MOSQUITTO_CTRL, "dynsec", "init", str(config), "admin", "admin-password"]
    subprocess.run(init, check=True, capture_output=True)
    listener = f"allow_anonymous false\nplugin {DYNSEC_PLUGIN}\nplugin_opt_config_file {config}\n"
    broker = Broker(folder, listener=listener).start()
    settings = MqttSection(broker=broker.url, username="admin", password={"value": "admin-password"})  # type: ignore[arg-type]
    link = connect(settings)
    try:
        dynsec = Dynsec(link)
        acls = [{"acltype": "publishClientSend", "topic": "edge/#", "allow": True}]
        dynsec.must("createRole", rolename="edge-operator", acls=acls)
        user, password = DYNSEC_OPERATOR
        roles = [{"rolename": "admin"}, {"rolename": "edge-operator"}]
        dynsec.must("createClient", username=user, password=password, roles=roles)
    finally:
        link.stop()
    return broker


class Watcher:
    """A test's own MQTT client: records every message on `filters` (newest per topic too),
    logged in as `username` with `password` when given."""

    def __init__(
        self, broker: Broker, filters: list[str], username: str | None = None, password: str | None = None
    ) -> None:
        self.messages: list[mqtt.MQTTMessage] = []
        self.latest: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._synced = threading.Event()
        self._token = os.urandom(16).hex().encode()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        if username is not None:
            self.client.username_pw_set(username, password)
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
        """Disconnect, then stop the network loop: the DISCONNECT wakes the loop at once, where
        `loop_stop()` first waits out the loop's one-second select (0.9 s a close, measured)."""
        self.client.disconnect()
        self.client.loop_stop()
