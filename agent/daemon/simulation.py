"""Simulated devices for measurements and tests: many `Agent`s of the real code in one process.

A simulated device is the daemon's own `Agent` without cameras: its own client id, state
directory, broker link, deployer, transfer and store, an activation that loads the model and
checks its parity as a device would, and its status, last will and commands. Only the cameras
are left out (so probation has nothing to watch: `probation_s` 0 by default) and the governor
(no cameras to slow down). `SimulatedFleet` builds the configs and starts and stops the agents;
bench/fleet_sim.py spreads a larger fleet over a few processes.

Threads: each agent's own (see agent/daemon/agent.py); `start` and `stop` run in the caller's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config.models import AgentConfig
from agent.daemon.agent import Agent
from agent.hardware.board import Board, probe


@dataclass(frozen=True)
class FleetSettings:
    """What every simulated device shares: the broker, its group, the keys it trusts for
    bundles and obeys for control, and agent.yaml keys over the simulation's defaults
    (`overrides`: section -> keys, merged one level deep)."""

    broker: str
    group: str | None
    trust_keys: tuple[Path, ...]
    operator_keys: tuple[Path, ...]
    overrides: dict[str, Any] = field(default_factory=dict)


def device_config(root: Path, device: str, settings: FleetSettings, page_port: int | None = None) -> AgentConfig:
    """agent.yaml of simulated device `device`, its state under ``root/device``; with
    `page_port`, its status page (and ``/metrics``) on ``127.0.0.1:page_port``.

    Autotune is off unless `settings.overrides` turns it on: it measures every way to run the
    version on every device (about 4 CPU-seconds each for the demo bundle), and what a
    simulated fleet shows is the broker, the transfer and the deployments' states."""
    raw: dict[str, Any] = {
        "device": {"id": device, **({"group": settings.group} if settings.group else {})},
        "state_dir": str(root / device),
        "trust_keys": [str(key) for key in settings.trust_keys],
        "operator_keys": [str(key) for key in settings.operator_keys],
        "mqtt": {"broker": settings.broker, "reconnect_min_s": 0.5, "reconnect_max_s": 5.0},
        "telemetry": {"interval_s": 10.0},
        "deployments": {"probation_s": 0.0, "autotune": False},
        "governor": {"enabled": False},
    }
    if page_port is not None:
        raw["status_page"] = {"listen": f"127.0.0.1:{page_port}"}
    for section, value in settings.overrides.items():
        raw[section] = (
            {**raw[section], **value} if isinstance(value, dict) and isinstance(raw.get(section), dict) else value
        )
    return AgentConfig.model_validate(raw)


class SimulatedFleet:
    """`devices` simulated in this process under `root`, all on one `board` (default: this
    machine's) and one wall `clock` (tests move it to open waves); `page_ports` gives a device
    its status page on a port of 127.0.0.1 (a Prometheus test scrapes several)."""

    def __init__(
        self,
        root: Path,
        devices: Sequence[str],
        settings: FleetSettings,
        board: Board | None = None,
        clock: Callable[[], float] = time.time,
        page_ports: Mapping[str, int] | None = None,
    ) -> None:
        self.root, self.settings = root, settings
        board = board or probe(Path("/"))
        ports = page_ports or {}
        self.agents = {
            device: Agent(device_config(root, device, settings, ports.get(device)), board, clock=clock)
            for device in devices
        }

    def start(self, devices: Iterable[str] | None = None, parallel: int = 8) -> SimulatedFleet:
        """Start `devices` (default: all), a few at a time: each connects and recovers its store.
        An agent starts once: a stopped device is simulated again by a new fleet on its state."""
        chosen = [self.agents[d] for d in devices] if devices is not None else list(self.agents.values())
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(lambda agent: agent.start(), chosen))
        return self

    def stop(self, parallel: int = 8) -> None:
        """Stop every agent cleanly (status offline, no last will)."""
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(lambda agent: agent.stop(), self.agents.values()))

    def __getitem__(self, device: str) -> Agent:
        return self.agents[device]

    def connected(self) -> int:
        """How many agents are connected to the broker now."""
        return sum(1 for agent in self.agents.values() if agent.link is not None and agent.link.connected)
