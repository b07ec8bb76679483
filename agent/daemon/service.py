"""The daemon as a systemd service (``Type=notify``): the sd_notify protocol and the watchdog.

`Notifier` sends the state lines systemd reads (``READY=1``, ``STATUS=...``, ``RELOADING=1``,
``STOPPING=1``, ``WATCHDOG=1``) as one datagram each to the socket named by ``$NOTIFY_SOCKET``
(a path, or ``@name`` in the abstract namespace); across the exec into another edge-agent version
``WATCHDOG_USEC=`` holds the watchdog (`EXEC_WATCHDOG_S`) until that version's READY=1 sets the
unit's own interval back. Without that variable (not started by systemd) it does nothing. A send
that fails is logged once and never stops the daemon.

`run_until_signalled` is the main thread of ``edge-agent run``: it starts the daemon, tells
READY, and waits for signals (SIGTERM / SIGINT stop, SIGHUP reloads) while ticking the watchdog.

`Service` decides when: `tick` (from the main thread, every `tick_s`) pings the watchdog every
half of ``$WATCHDOG_USEC`` only while the agent's `Health` is ok, so a hung camera or MQTT loop
stops the pings and systemd restarts the service after ``WatchdogSec=``; it also keeps
``STATUS=`` current (every `STATUS_EVERY_S` seconds; a change of health shows at the next ping
or refresh). Health is asked only when one of them is due. The clock is injected.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from agent.deployment.agent_switch import RESTART
from agent.mqtt.link import MqttLink
from agent.snapshot import Health

log = logging.getLogger(__name__)

STATUS_EVERY_S = 5.0  # how often STATUS= is refreshed while nothing changes
#: the watchdog systemd is told to hold across the exec into another version, until that one says
#: READY=1: systemd/edge-agent.service's TimeoutStartSec (a first start may build a TensorRT engine)
EXEC_WATCHDOG_S = 600.0


class Notifier:
    """sd_notify to `address` (None: not under systemd, every call does nothing)."""

    def __init__(self, address: str | None) -> None:
        self.address = address
        self._failed = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> Notifier:
        return cls(environ.get("NOTIFY_SOCKET") or None)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *lines: str) -> None:
        """One datagram of ``KEY=value`` lines."""
        if self.address is None:
            return
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.sendto("\n".join(lines).encode(), target)
            self._failed = False
        except OSError as exc:
            if not self._failed:
                log.error("systemd: cannot notify %s: %s", self.address, exc)
            self._failed = True


def watchdog_interval_s(environ: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """``$WATCHDOG_USEC`` in seconds when the watchdog is meant for this process
    (``$WATCHDOG_PID`` unset or ours), else None."""
    usec, owner = environ.get("WATCHDOG_USEC"), environ.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    if owner and owner.isdigit() and int(owner) != (pid if pid is not None else os.getpid()):
        return None
    return int(usec) / 1e6


class Service:
    """The service's side of systemd for one run: `notifier`, the watchdog's `watchdog_s`
    (None: no watchdog) and `clock` (monotonic seconds)."""

    def __init__(
        self, notifier: Notifier, watchdog_s: float | None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.notifier, self.watchdog_s, self._clock = notifier, watchdog_s, clock
        self._next_ping = self._next_status = clock()
        self._problems: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls) -> Service:
        return cls(Notifier.from_environment(), watchdog_interval_s())

    @property
    def tick_s(self) -> float:
        """How often the main thread should call `tick`."""
        return min(0.5, self.watchdog_s / 4) if self.watchdog_s else 0.5

    def ready(self, link: MqttLink | None, status: Callable[[], str], wait_s: float = 30.0) -> None:
        """READY=1 once the broker was tried once (`link` None: no broker; the caller started
        the cameras); `status` makes the STATUS= line."""
        if not self.notifier.enabled:
            return
        if link is not None and not link.wait_attempted(wait_s):
            log.warning("mqtt: no answer from %s yet; telling systemd the agent is ready", link.settings.broker)
        # the unit's own interval again, after an exec into this version held it at EXEC_WATCHDOG_S
        interval = (f"WATCHDOG_USEC={round(self.watchdog_s * 1e6)}",) if self.watchdog_s is not None else ()
        self.notifier.send("READY=1", f"STATUS={status()}", *interval)
        self._next_status = self._clock() + STATUS_EVERY_S

    def reloading(self) -> None:
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> None:
        self.notifier.send("STOPPING=1", "STATUS=stopping")

    def tick(self, health_now: Callable[[], Health], status: Callable[[], str]) -> None:
        """Ping the watchdog when due and the agent's health (asked only then, or when STATUS=
        is due: it reads every camera) is ok; refresh ``STATUS=`` (made by `status`)."""
        now = self._clock()
        ping_due = self.watchdog_s is not None and now >= self._next_ping
        if not ping_due and not (self.notifier.enabled and now >= self._next_status):
            return
        health = health_now()
        changed = health.problems != self._problems
        if changed and not health.ok:
            log.error("unhealthy, the watchdog is no longer pinged: %s", "; ".join(health.problems))
        elif changed:
            log.info("healthy again: the watchdog is pinged")
        self._problems = health.problems
        if health.ok and ping_due and self.watchdog_s is not None:
            self.notifier.send("WATCHDOG=1")
            self._next_ping = now + self.watchdog_s / 2
        if self.notifier.enabled and (changed or now >= self._next_status):
            text = status() if health.ok else "hung: " + "; ".join(health.problems)
            self.notifier.send(f"STATUS={text}")
            self._next_status = now + STATUS_EVERY_S


class Daemon(Protocol):
    """What `run_until_signalled` drives (`agent.daemon.agent.Agent`)."""

    link: MqttLink | None

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def reload(self) -> None: ...
    def health(self) -> Health: ...
    def service_status(self) -> str: ...


class Restarts(Protocol):
    """Whether the agent must restart into another version (`agent_switch.AgentWatch`)."""

    def restart(self, healthy: Callable[[], bool], now: float) -> bool: ...


def run_until_signalled(daemon: Daemon, service: Service | None = None, restarts: Restarts | None = None) -> int:
    """Start `daemon`, tell systemd READY, then wait on the main thread (signal handlers can only
    be set there): SIGHUP reloads it (RELOADING, then READY again), SIGTERM or SIGINT stops it
    (STOPPING); between signals `Service.tick` pings the watchdog while it is healthy, and
    `restarts` is asked whether the agent switched versions (then it stops, telling systemd
    RELOADING rather than STOPPING, and returns `RESTART`). Returns 0 or `RESTART`."""
    service = service or Service.from_environment()
    stop, reload = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: reload.set())
    daemon.start()
    service.ready(daemon.link, daemon.service_status)
    code = 0
    try:
        while not stop.wait(service.tick_s):
            if reload.is_set():
                reload.clear()
                service.reloading()
                daemon.reload()
                service.ready(daemon.link, daemon.service_status)
            if service.notifier.enabled:
                service.tick(daemon.health, daemon.service_status)
            if restarts is not None and restarts.restart(lambda: _serving(daemon), time.monotonic()):
                code = RESTART
                break
    finally:
        if code == RESTART:  # the same pid execs the new version, which says READY=1 again
            # and pings only from then: until that, the watchdog waits as long as a first start may
            hold = (f"WATCHDOG_USEC={round(EXEC_WATCHDOG_S * 1e6)}",) if service.watchdog_s is not None else ()
            service.notifier.send("RELOADING=1", "STATUS=restarting into another edge-agent version", *hold)
        else:
            service.stopping()
        daemon.stop()
    return code


def _serving(daemon: Daemon) -> bool:
    """A new version's probation passes: every loop turns and the broker (if any) is connected."""
    return daemon.health().ok and (daemon.link is None or daemon.link.connected)
