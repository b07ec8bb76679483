"""The daemon as a systemd service: the unit checked by systemd-analyze, and ``edge-agent run``
under a ``$NOTIFY_SOCKET`` owned by the test (READY, STATUS, the watchdog's pings, RELOADING,
STOPPING), its pings stopping while a camera loop hangs; the MQTT link's own liveness."""

from __future__ import annotations

import configparser
import itertools
import re
import shutil
import signal
import socket
import statistics
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.config.models import MqttSection
from agent.mqtt.link import Message, MqttLink
from tests.camera_stream import MjpegStream
from tests.conftest import REPO
from tests.mqtt_tools import AgentProcess, Broker, agent_config, wait_until
from tests.needs import missing
from tests.page_tools import install_versions

UNIT = REPO / "systemd" / "edge-agent.service"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or ""


@pytest.fixture
def systemd_analyze() -> str:
    if not SYSTEMD_ANALYZE:
        missing("systemd", "systemd-analyze is missing (apt-get install systemd)")
    return SYSTEMD_ANALYZE


def unit_settings() -> dict[str, list[str]]:
    """Every ``Key=value`` of the unit's [Service] section, repeated keys in order."""
    settings: dict[str, list[str]] = {}
    section = None
    for line in UNIT.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_systemd_analyze_verify_passes(tmp_path: Path, systemd_analyze: str) -> None:
    """The unit as it is in the repository. Its ExecStart, /opt/edge-agent/venv/bin/edge-agent,
    exists on a device, not here: in a private mount namespace (root) a stub takes its place;
    without the right to make one, a copy naming this checkout's own edge-agent is verified."""
    stub = (
        'mount -t tmpfs tmpfs /opt && mkdir -p /opt/edge-agent/venv/bin && printf "#!/bin/sh\\n" > {0} && chmod +x {0}'
    )
    script = stub.format("/opt/edge-agent/venv/bin/edge-agent") + f" && {systemd_analyze} verify {UNIT}"
    result = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True)
    if "unshare failed" in result.stderr or "Operation not permitted" in result.stderr:
        copy = tmp_path / "edge-agent.service"
        copy.write_text(
            UNIT.read_text().replace("/opt/edge-agent/venv/bin/edge-agent", str(REPO / ".venv/bin/edge-agent"))
        )
        result = subprocess.run([systemd_analyze, "verify", str(copy)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "edge-agent.service" not in result.stderr, result.stderr  # no warning about our unit


def test_the_unit_exposure_is_at_most_2_5(systemd_analyze: str) -> None:
    result = subprocess.run(
        [systemd_analyze, "security", "--offline=yes", str(UNIT)], capture_output=True, text=True, check=False
    )
    found = re.search(r"Overall exposure level for edge-agent\.service: ([\d.]+)", result.stdout)
    assert found, result.stdout + result.stderr
    assert float(found.group(1)) <= 2.5, result.stdout


def test_the_unit_is_notify_with_a_watchdog_a_user_and_the_devices_it_needs() -> None:
    configparser.ConfigParser(strict=False).read_string(UNIT.read_text())  # well formed
    s = unit_settings()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"] and s["Restart"] == ["on-failure"]
    assert s["WatchdogSec"] and s["User"] == ["edge-agent"]
    assert set(s["SupplementaryGroups"][0].split()) == {"video", "gpio", "i2c", "render"}
    assert s["StateDirectory"] == ["edge-agent"] and s["ConfigurationDirectory"] == ["edge-agent"]
    assert s["DevicePolicy"] == ["closed"] and s["ProtectSystem"] == ["strict"] and s["CapabilityBoundingSet"] == [""]
    allowed = {value.split()[0] for value in s["DeviceAllow"]}
    assert {"char-video4linux", "char-gpiochip", "char-i2c", "/dev/nvmap", "char-drm"} <= allowed
    assert "ProcSubset" not in s, "psutil reads /proc/stat"
    assert s["ExecStart"][0].split()[1:] == ["run", "--config", "/etc/edge-agent/agent.yaml"]


class NotifySocket:
    """The test's ``$NOTIFY_SOCKET``: every datagram with the monotonic time it arrived."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.received: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.received += [(time.monotonic(), line) for line in data.decode().splitlines()]

    def lines(self, since: float = 0.0) -> list[tuple[float, str]]:
        with self._lock:
            return [(t, line) for t, line in self.received if t >= since]

    def wait(self, predicate: str, since: float = 0.0, timeout: float = 60) -> tuple[float, str]:
        """The first line since `since` that starts with `predicate`."""
        found = wait_until(
            lambda: next(((t, line) for t, line in self.lines(since) if line.startswith(predicate)), None),
            timeout,
            f"{predicate} from the agent",
        )
        return found  # type: ignore[no-any-return]

    def close(self) -> None:
        self._closed.set()
        self.sock.close()


def test_ready_status_watchdog_reloading_and_stopping_under_a_notify_socket(
    tmp_path: Path, broker: Broker, bundles: dict[str, Path], keys: dict[str, Path]
) -> None:
    from agent.hardware.probe import probe

    notify, camera = NotifySocket(tmp_path / "notify"), MjpegStream(fps=10)
    path = agent_config(
        tmp_path,
        broker,
        "svc-1",
        keys["public"],
        operator_key=keys["operator_pub"],
        pipelines=[{"name": "door", "source": camera.url, "max_fps": 10}],
        health={"stall_s": 2},
    )
    install_versions(tmp_path / "svc-1" / "state", bundles, keys, probe())
    agent = AgentProcess(path, env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "2000000"}).start()
    try:
        ready_at, _ = notify.wait("READY=1")
        status = next(line for t, line in notify.lines(ready_at) if line.startswith("STATUS="))
        assert re.match(r"STATUS=serving demo 1\.1\.0 on \w+: 1 camera\(s\) at [\d.]+ FPS; broker connected", status)

        pings_from = notify.wait("WATCHDOG=1", ready_at)[0]
        wait_until(lambda: len([1 for _, line in notify.lines(pings_from) if line == "WATCHDOG=1"]) >= 5, 30, "pings")
        times = [t for t, line in notify.lines(pings_from) if line == "WATCHDOG=1"]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert statistics.median(gaps) < 2.0, f"pings every half of WATCHDOG_USEC (2 s), got gaps {gaps}"

        camera.stall()  # the camera loop hangs in read(): the pings must stop
        hung_at, hung = notify.wait("STATUS=hung: ", pings_from)
        assert "camera door" in hung
        time.sleep(3.0)  # longer than the watchdog interval: a ping now would be a bug
        assert [line for _, line in notify.lines(hung_at + 0.1) if line == "WATCHDOG=1"] == []
        camera.resume()
        notify.wait("WATCHDOG=1", hung_at + 0.1)

        reload_at = time.monotonic()
        assert agent.process is not None
        agent.process.send_signal(signal.SIGHUP)
        notify.wait("RELOADING=1", reload_at)
        notify.wait("MONOTONIC_USEC=", reload_at)
        notify.wait("READY=1", notify.wait("RELOADING=1", reload_at)[0])

        stop_at = time.monotonic()
        assert agent.stop() == 0, agent.output()
        notify.wait("STOPPING=1", stop_at, timeout=5)
    finally:
        camera.resume()
        if agent.alive():
            agent.kill()
        camera.close()
        notify.close()
    assert "unhealthy, the watchdog is no longer pinged: camera door" in agent.output()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread that dies
def test_the_link_reconnects_when_paho_network_thread_dies(broker: Broker) -> None:
    """A handler that raises past paho ends paho's network thread; the link's supervisor sees it
    and connects again, instead of staying connected in name only."""
    link = MqttLink(MqttSection(broker=broker.url, reconnect_min_s=0.1, reconnect_max_s=0.5), "link-test")
    got: list[str] = []

    def handler(message: Message) -> None:
        if message.payload == b"die":
            raise SystemExit("a handler bug that is not an Exception")
        got.append(message.payload.decode())

    link.subscribe("t/#", handler)
    link.start()
    try:
        assert link.wait_attempted(10) and link.wait_connected(10)
        assert link.stats().stalled_s < 2.0
        link.publish("t/x", b"die", qos=0)
        wait_until(lambda: link.last_error and "network thread" in link.last_error, 15, "the dead thread noticed")
        wait_until(lambda: link.connected, 15, "the link connected again")
        wait_until(lambda: link.publish("t/x", b"alive", qos=1) and "alive" in got, 15, "a message after it")
    finally:
        link.stop()
