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
    import os

    import semver

    from agent import __version__
    from agent.deployment.agent_env import AgentUpdateError, check_wheels, install_env
    from agent.deployment.agent_switch import BASE_ENV, AgentDirs, running_environment
    from agent.errors import ErrorCode

    config = device_config(args)
    if len(args.wheels) > MAX_WHEELS:
        raise CliError(f"AGENT_UPDATE_MALFORMED: at most {MAX_WHEELS} wheels, not {len(args.wheels)}")
    running = running_environment()
    dirs = AgentDirs(config.state_dir, Path(os.environ.get(BASE_ENV) or running))
    try:
        version = check_wheels(args.wheels)
        now = dirs.current_version() or __version__
        if semver.Version.parse(version) <= semver.Version.parse(now) and not args.allow_downgrade:
            reason = f"{version} is not newer than {now} (--allow-downgrade to switch back)"
            raise AgentUpdateError(ErrorCode.AGENT_UPDATE_DOWNGRADE, reason)
        if version == dirs.current_version() or dirs.env(version) == running:
            raise AgentUpdateError(ErrorCode.AGENT_UPDATE_RUNNING, f"{version} is the running version")
        for old in dirs.prune(keep=version):
            print(f"removed edge-agent {old}'s environment")
        install_env(dirs.root, version, args.wheels, dirs.base)  # again if it was: the wheels given
    except AgentUpdateError as exc:
        raise CliError(str(exc)) from exc
    dirs.switch(version)
    print(f"switched to edge-agent {version} (from {now}); the running agent restarts into it")
    return 0
