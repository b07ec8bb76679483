"""The agent as the tests and benchmarks run it: an agent.yaml for a test device, and ``edge-agent
run`` in its own process."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from testkit import REPO
from testkit.broker import Broker

#: names one file for the runtime probe's answer (agent.yaml's ``runtime_probe_cache``) that
#: every agent `agent_config` writes a config for shares; tests/conftest.py sets it to a file of
#: the xdist worker's own, so that a worker's agents probe once, not at every start (half a
#: CPU-second each), and scripts the tests run (the red team, the soak) inherit it
PROBE_CACHE_ENV = "EDGE_AGENT_TEST_PROBE_CACHE"


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
    Without `operator_key` the device obeys unsigned control; `pipelines=` (the old name of
    ``cameras:``) replaces the default camera, as ``cameras=`` does, and the agent warns of it."""
    config: dict[str, Any] = {
        "device": {"id": device, **({"group": group} if group else {})},
        "state_dir": str(tmp / device / "state"),
        "trust_keys": [str(trust_key)] if trust_key else [],
        "allow_unsigned": trust_key is None,
        "operator_keys": [str(operator_key)] if operator_key else [],
        "allow_unsigned_control": operator_key is None,
        "mqtt": {"broker": broker.url, "reconnect_min_s": 0.2, "reconnect_max_s": 1.0},
        "cameras": [{"name": "cam0", "source": "synthetic", "max_fps": 10}],
        # the fleet tests time transfers (autotune measures at each activation; test_matrix.py tests it)
        "deployments": {"autotune": False, "probation_s": 1.0},
        "telemetry": {"interval_s": 0.5},
        "events": {"min_interval_s": 1.0},
    }
    if os.environ.get(PROBE_CACHE_ENV):
        config["runtime_probe_cache"] = os.environ[PROBE_CACHE_ENV]
    if "pipelines" in overrides:
        del config["cameras"]
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

    def __init__(
        self,
        config: Path,
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        max_files: int | None = None,
        wrap: tuple[str, ...] = (),
    ) -> None:
        """`args` go after ``run --config FILE`` (``("--root", tree)``); `max_files` lowers the
        process's limit of open files (``ulimit -n``, soft and hard); `wrap` is a command the
        agent's command line is appended to (``unshare -m sh -c '...; exec "$@"' sh``)."""
        self.config, self.log = config, config.with_suffix(".log")
        self.env = {**os.environ, **(env or {})}
        self.args, self.max_files, self.wrap = args, max_files, wrap
        self.process: subprocess.Popen[bytes] | None = None
        self._terminated = False  # SIGTERM sent to this process (`terminate`): `stop` only waits

    def start(self) -> AgentProcess:
        self._terminated = False
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*self.wrap, sys.executable, "-m", "agent.cli", "-v", "run", "--config", str(self.config), *self.args],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=None if self.max_files is None else self._limit_files,
            )
        return self

    def _limit_files(self) -> None:
        assert self.max_files is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.max_files, self.max_files))

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def terminate(self) -> None:
        """Send SIGTERM and return at once; `stop` then waits for the end. Several agents stop
        side by side this way instead of one after another (about 1.5 s each on a loaded machine)."""
        assert self.process is not None
        if self.process.poll() is None and not self._terminated:
            self.process.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.terminate()
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                raise AssertionError(f"the agent did not stop within {timeout} s:\n{self.output()}") from None
        return self.process.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""
