"""A real Home Assistant core for the discovery test: ``hass`` from the side environment
``build/ha-env`` (made by ``scripts/setup.sh dev``: HA needs dependencies of its own), started
on a free port with its MQTT integration pointed at the test's mosquitto.

The MQTT broker is a config entry (HA 2024.x sets it up only that way), pre-seeded in
``.storage/core.config_entries``; onboarding's first step makes the owner and gives an auth code,
exchanged for an access token for the REST API. ``--skip-pip``: HA never installs anything at run
time (paho-mqtt is pre-installed in the side environment)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from testkit import REPO
from testkit.net import free_port, wait_until

#: the side environment with Home Assistant core (scripts/setup.sh dev)
HA_ENV = REPO / "build" / "ha-env"
HASS = HA_ENV / "bin" / "hass"


def _config(port: int, frontend: bool) -> str:
    return (
        "homeassistant:\n  name: edge-agent test\n  unit_system: metric\n  time_zone: UTC\n"
        "  latitude: 0\n  longitude: 0\n  elevation: 0\n  currency: EUR\n  country: DE\n"
        f"http:\n  server_host: 127.0.0.1\n  server_port: {port}\napi:\nonboarding:\n"
        + ("frontend:\nconfig:\n" if frontend else "")
    )


def _entries(broker_port: int) -> dict[str, Any]:
    entry = {
        "entry_id": "edgeagenttestmqtt0000000000000000",
        "version": 1,
        "minor_version": 1,
        "domain": "mqtt",
        "title": "mosquitto",
        "data": {"broker": "127.0.0.1", "port": broker_port, "discovery": True},
        "options": {},
        "pref_disable_new_entities": False,
        "pref_disable_polling": False,
        "source": "user",
        "unique_id": None,
        "disabled_by": None,
    }
    return {"version": 1, "minor_version": 1, "key": "core.config_entries", "data": {"entries": [entry]}}


class HomeAssistant:
    """``hass -c CONFIG`` on a free port; `states()` reads ``/api/states`` with a token. With
    `frontend`, HA also serves its web UI and the config panel (the screenshot's device page);
    `tokens` is the whole token answer (access and refresh token) a browser session needs."""

    def __init__(self, config_dir: Path, broker_port: int, frontend: bool = False) -> None:
        self.config_dir, self.port = config_dir, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (config_dir / ".storage").mkdir(parents=True, exist_ok=True)
        (config_dir / "configuration.yaml").write_text(_config(self.port, frontend))
        (config_dir / ".storage" / "core.config_entries").write_text(json.dumps(_entries(broker_port)))
        if frontend:  # onboarding's other steps done, so the UI opens, not its wizard (whose
            # location step would set up integrations this env has no requirements for)
            done = {"done": ["core_config", "analytics", "integration"]}
            onboarding = {"version": 4, "minor_version": 1, "key": "onboarding", "data": done}
            (config_dir / ".storage" / "onboarding").write_text(json.dumps(onboarding))
        self.log = (config_dir / "hass.out").open("wb")
        self.process: subprocess.Popen[bytes] | None = None
        self.token = ""
        self.tokens: dict[str, Any] = {}

    def start(self, timeout: float = 240) -> HomeAssistant:
        cmd = [str(HASS), "-c", str(self.config_dir), "--skip-pip", "--log-file", str(self.config_dir / "ha.log")]
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self._answers, timeout, f"Home Assistant on {self.url} (log: {self.config_dir / 'ha.log'})", 0.5)
        client = self.url + "/"
        owner = {
            "client_id": client,
            "name": "Test",
            "username": "test",
            "password": "edge-agent-test",
            "language": "en",
        }
        code = self._post("/api/onboarding/users", json.dumps(owner).encode(), "application/json")["auth_code"]
        form = urllib.parse.urlencode({"grant_type": "authorization_code", "code": code, "client_id": client})
        self.tokens = self._post("/auth/token", form.encode(), "application/x-www-form-urlencoded")
        self.token = self.tokens["access_token"]
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(
                f"hass exited {self.process.returncode}: {(self.config_dir / 'hass.out').read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(self.url + "/api/onboarding", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _post(self, path: str, body: bytes, content_type: str) -> Any:
        request = urllib.request.Request(self.url + path, body, {"Content-Type": content_type})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def render(self, template: str) -> str:
        """`template` rendered by HA (``/api/template``), e.g. ``{{ device_id('sensor.x') }}``."""
        request = urllib.request.Request(
            self.url + "/api/template",
            json.dumps({"template": template}).encode(),
            {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return str(answer.read().decode())

    def get_bytes(self, path: str) -> bytes:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return bytes(answer.read())

    def states(self) -> dict[str, dict[str, Any]]:
        """Every entity's state document by entity id."""
        return {s["entity_id"]: s for s in self.get("/api/states")}

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
