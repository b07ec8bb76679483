"""`agent.daemon.service`: READY, STATUS, WATCHDOG, RELOADING and STOPPING over a real notify socket,
the watchdog's schedule from the environment, pinged only while healthy."""

from __future__ import annotations

import itertools
import re
import signal
import socket
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from testkit import REPO
from testkit.agent_process import AgentProcess, agent_config
from testkit.broker import Broker
from testkit.bundles import install_versions
from testkit.camera_stream import MjpegStream
from testkit.net import wait_until

from agent.daemon.service import EXEC_WATCHDOG_S, Notifier, Service, run_until_signalled, watchdog_interval_s
from agent.deployment.agent_switch import RESTART
from agent.snapshot import Health


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
    from agent.hardware.board import probe

    notify, camera = NotifySocket(tmp_path / "notify"), MjpegStream(fps=10)
    path = agent_config(
        tmp_path,
        broker,
        "svc-1",
        keys["public"],
        operator_key=keys["operator_pub"],
        cameras=[{"name": "door", "source": camera.url, "max_fps": 10}],
        health={"stall_s": 2},
    )
    install_versions(tmp_path / "svc-1" / "state", keys, bundles, probe())
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
        # the next STATUS= line is the refresh STATUS_EVERY_S (5 s) after that one, from a tick that
        # asked the health again; pings were due every second meanwhile, and none may have gone out
        refreshed_at, refreshed = notify.wait("STATUS=", hung_at + 0.001)
        assert refreshed.startswith("STATUS=hung: "), refreshed
        assert [line for t, line in notify.lines(hung_at + 0.001) if line == "WATCHDOG=1" and t <= refreshed_at] == []
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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Recorder(Notifier):
    def __init__(self) -> None:
        super().__init__("/run/test")
        self.sent: list[tuple[float, tuple[str, ...]]] = []
        self.clock: Clock | None = None

    def send(self, *lines: str) -> None:
        self.sent.append((self.clock.now if self.clock else 0.0, lines))


def test_the_watchdog_is_pinged_every_half_interval_only_while_healthy() -> None:
    clock, notifier = Clock(), Recorder()
    notifier.clock = clock
    service = Service(notifier, watchdog_s=4.0, clock=clock)
    assert service.tick_s == 0.5
    service.ready(None, lambda: "serving demo")
    for step in range(40):  # 20 s healthy, then hung from 10 s to 16 s
        clock.now = step * 0.5
        hung = 10.0 <= clock.now < 16.0
        health = Health(False, ("camera cam0: hung",)) if hung else Health(True)
        service.tick(lambda: health, lambda: "serving demo")  # noqa: B023 - called before the next turn
    pings = [t for t, lines in notifier.sent if lines == ("WATCHDOG=1",)]
    assert pings == [0.0, 2.0, 4.0, 6.0, 8.0, 16.0, 18.0]
    statuses = [(t, lines[0]) for t, lines in notifier.sent if lines[0].startswith("STATUS=")]
    assert (10.0, "STATUS=hung: camera cam0: hung") in statuses and (16.0, "STATUS=serving demo") in statuses
    assert notifier.sent[0] == (0.0, ("READY=1", "STATUS=serving demo", "WATCHDOG_USEC=4000000"))


@pytest.mark.parametrize(
    ("environ", "interval"),
    [({}, None), ({"WATCHDOG_USEC": "30000000"}, 30.0), ({"WATCHDOG_USEC": "0"}, None),
     ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7"}, 2.0),
     ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "8"}, None), ({"WATCHDOG_USEC": "junk"}, None)],
)  # fmt: skip
def test_watchdog_settings_from_the_environment(environ: dict[str, str], interval: float | None) -> None:
    assert watchdog_interval_s(environ, pid=7) == interval


@pytest.mark.parametrize("abstract", [False, True])
def test_the_notifier_sends_datagrams_to_a_socket_path_or_an_abstract_name(tmp_path: Path, abstract: bool) -> None:
    address = f"@edge-agent-test-{id(tmp_path)}" if abstract else str(tmp_path / "notify")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + address[1:] if abstract else address)
        server.settimeout(5)
        Notifier.from_environment({"NOTIFY_SOCKET": address}).send("READY=1", "STATUS=up")
        assert server.recv(4096) == b"READY=1\nSTATUS=up"
    Notifier(str(tmp_path / "gone")).send("WATCHDOG=1")  # logged, never raised
    assert not Notifier.from_environment({}).enabled


class Signalled:
    """A daemon for `run_until_signalled` that notes what it was asked, and sends the main
    thread its next signal from a thread once it reached each step (SIGHUP after the start,
    SIGTERM after the reload)."""

    link = None

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _then(self, call: str, signum: signal.Signals | None) -> None:
        self.calls.append(call)
        if signum is not None:
            threading.Thread(target=signal.raise_signal, args=(signum,)).start()

    def start(self) -> None:
        self._then("start", signal.SIGHUP)

    def reload(self) -> None:
        self._then("reload", signal.SIGTERM)

    def stop(self) -> None:
        self._then("stop", None)

    def health(self) -> Health:
        self.calls.append("health")
        return Health(True)

    def service_status(self) -> str:
        return "serving"


def test_the_main_thread_reloads_on_sighup_and_stops_on_sigterm() -> None:
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    daemon, notifier = Signalled(), Recorder()
    try:
        assert run_until_signalled(daemon, Service(notifier, watchdog_s=None)) == 0
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert [c for c in daemon.calls if c != "health"] == ["start", "reload", "stop"]
    sent = [lines[0] for _, lines in notifier.sent]
    assert sent[0] == "READY=1" and sent[-1] == "STOPPING=1"
    assert sent[sent.index("RELOADING=1") + 1] == "READY=1", "ready again after the reload"


class Stalled(Signalled):
    """Sends no signal, and a camera of it has stalled."""

    def start(self) -> None:
        self._then("start", None)

    def health(self) -> Health:
        self.calls.append("health")
        return Health(False, ("cam0 stalled",))


class RestartOnSecondAsk:
    """`agent_switch.AgentWatch`'s seam: asks `healthy` each time, restarts the second time."""

    def __init__(self) -> None:
        self.healthy: list[bool] = []

    def restart(self, healthy: Callable[[], bool], now: float) -> bool:
        self.healthy.append(healthy())
        return len(self.healthy) == 2


def test_a_version_switch_stops_the_daemon_as_reloading_and_returns_restart() -> None:
    daemon, notifier, restarts = Stalled(), Recorder(), RestartOnSecondAsk()
    assert run_until_signalled(daemon, Service(notifier, watchdog_s=None), restarts) == RESTART
    assert [c for c in daemon.calls if c != "health"] == ["start", "stop"]
    assert restarts.healthy == [False, False], "a stalled camera: a new version is not confirmed"
    sent = [lines[0] for _, lines in notifier.sent]
    assert "STOPPING=1" not in sent and sent[-1] == "RELOADING=1", "systemd keeps the unit active across the exec"


def test_the_exec_into_another_version_holds_the_watchdog_until_the_new_one_is_ready() -> None:
    """Seen on the booted VM: the new version, still starting 90 s after the old one's last ping,
    was killed by systemd's watchdog (`WatchdogSec=`); across the exec systemd is told to wait
    `EXEC_WATCHDOG_S` (the unit's TimeoutStartSec), and READY=1 gives the unit's own interval back."""
    daemon, notifier, restarts = Stalled(), Recorder(), RestartOnSecondAsk()
    assert run_until_signalled(daemon, Service(notifier, watchdog_s=90.0), restarts) == RESTART
    last = notifier.sent[-1][1]
    assert last[0] == "RELOADING=1" and f"WATCHDOG_USEC={int(EXEC_WATCHDOG_S * 1e6)}" in last
    unit = (REPO / "systemd/edge-agent.service").read_text()
    assert f"TimeoutStartSec={EXEC_WATCHDOG_S / 60:.0f}min" in unit, "as long as a first start may take"

    # the new process (the same pid): READY=1 sets the unit's interval again, from $WATCHDOG_USEC
    started = Recorder()
    Service(started, watchdog_s=90.0).ready(None, lambda: "serving")
    assert started.sent[-1][1][0] == "READY=1" and "WATCHDOG_USEC=90000000" in started.sent[-1][1]

    # without a watchdog nothing arms one
    quiet, restarts = Recorder(), RestartOnSecondAsk()
    assert run_until_signalled(Stalled(), Service(quiet, watchdog_s=None), restarts) == RESTART
    Service(quiet, watchdog_s=None).ready(None, lambda: "serving")
    assert not [line for _, lines in quiet.sent for line in lines if line.startswith("WATCHDOG_USEC")]
