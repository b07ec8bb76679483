"""`edge-agent upgrade`: install a new edge-agent from wheels beside the running one and
switch to it; the running daemon sees the switch and restarts into it (docs/fleet.md#agent-updates)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent.cli.args import device_config, state_arguments
from agent.cli.failure import CliError

MAX_WHEELS = 50


def add_parser(commands: Any) -> None:
    """Add ``edge-agent upgrade`` to the subparsers."""
    update = commands.add_parser("upgrade", help="update edge-agent itself on this device from wheels")
    update.add_argument("wheels", type=Path, nargs="+", help="edge-agent's wheel and any changed dependency's")
    update.add_argument("--allow-downgrade", action="store_true", help="switch to a version older than the running one")
    state_arguments(update)


def run(args: argparse.Namespace) -> int:
    from agent import __version__
    from agent.deployment.agent_env import AgentUpdateError, install_update
    from agent.deployment.agent_switch import AgentDirs, base_environment, running_environment

    config = device_config(args)
    if len(args.wheels) > MAX_WHEELS:
        raise CliError(f"AGENT_UPDATE_MALFORMED: at most {MAX_WHEELS} wheels, not {len(args.wheels)}")
    dirs = AgentDirs(config.state_dir, base_environment())
    now = dirs.current_version() or __version__
    try:
        version = install_update(
            dirs,
            args.wheels,
            running_environment(),
            args.allow_downgrade,
            on_removed=lambda old: print(f"removed edge-agent {old}'s environment"),
        )
    except AgentUpdateError as exc:
        raise CliError(str(exc)) from exc
    dirs.switch(version)
    print(f"switched to edge-agent {version} (from {now}); the running agent restarts into it")
    return 0
