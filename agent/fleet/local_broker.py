"""A mosquitto of one's own on 127.0.0.1, to try a fleet on one machine: `LocalBroker`.

The one broker starter of the repository's Python: the demo's simulated fleet
(`bench/fleet_sim.py`, run by `scripts/demo.sh` from the plain install), the other benchmarks, and
the tests through `testkit.broker.Broker` (which picks the port from its worker's block) start
mosquitto with it. It needs Debian's ``mosquitto`` (`scripts/setup.sh` installs it); a device
never starts one.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

#: mosquitto's program (Debian puts it in /usr/sbin, often not on a user's PATH); None: not installed
MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None)


class LocalBrokerError(RuntimeError):
    """mosquitto is not installed, exited at its start, or did not listen in time."""


def any_free_port() -> int:
    """A port of 127.0.0.1 free now, as the kernel picks one (from its ephemeral range)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LocalBroker:
    """mosquitto on `port` of 127.0.0.1 (0: a free one the kernel picks), its config and log in
    `folder`. `listener` holds the listener's options (anonymous by default), `extra` more lines
    for its config; with `persistence` retained messages survive a restart (autosaved every
    second into `folder`), without it nothing is written; `nodelay` sets TCP_NODELAY, as a fleet
    wants (a chunk is not held back waiting for the previous one's acknowledgement).

    `start` returns once it accepts connections; `kill` (SIGKILL: what it last autosaved
    survives) and `stop` end it, and `start` again serves on the same port."""

    def __init__(
        self,
        folder: Path,
        port: int = 0,
        extra: str = "",
        listener: str = "allow_anonymous true\n",
        persistence: bool = False,
        nodelay: bool = True,
    ) -> None:
        self.folder, self.port = folder, port or any_free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.conf = folder / "mosquitto.conf"
        user = pwd.getpwuid(os.geteuid()).pw_name  # as root, mosquitto would switch to the user "mosquitto"
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

    def start(self, timeout_s: float = 10.0) -> LocalBroker:
        if MOSQUITTO is None:
            raise LocalBrokerError("mosquitto is not installed (apt-get install mosquitto; scripts/setup.sh does)")
        self.process = process = subprocess.Popen([MOSQUITTO, "-c", str(self.conf)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                said = process.stderr.read().decode(errors="replace") if process.stderr else ""
                log = self.folder / "mosquitto.log"
                said += log.read_text(errors="replace") if log.is_file() else ""
                raise LocalBrokerError(f"mosquitto exited ({process.returncode}): {said.strip()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise LocalBrokerError(f"mosquitto did not listen on 127.0.0.1:{self.port} within {timeout_s:.0f} s")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: what it persisted at its last autosave (every second) survives."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._close()

    def _close(self) -> None:
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()
