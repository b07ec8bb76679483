"""`edge-agent rollback`: back to the previous version on this device."""

from __future__ import annotations

import argparse
from typing import Any

from agent.cli.args import device_config, state_arguments
from agent.cli.failure import CliError


def add_parser(commands: Any) -> None:
    """Add ``edge-agent rollback`` to the subparsers."""
    rollback = commands.add_parser("rollback", help="return to the previous version")
    state_arguments(rollback)


def run(args: argparse.Namespace) -> int:
    from agent.bundles.installer import rollback
    from agent.bundles.store import Store

    config = device_config(args)
    try:
        deployment = rollback(Store(config.state_dir, keep=config.keep_versions, runtimes=config.runtime_settings()))
    except LookupError as exc:
        raise CliError(str(exc)) from exc
    print(f"rolled back to {deployment.name} {deployment.version} ({deployment.sha256[:12]})")
    return 0
