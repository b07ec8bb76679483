"""`edge-agent install BUNDLE`: the deployment state machine on this device, from a file
(verify, install, activate with a parity check, switch; docs/bundles.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent.bundles.record import State
from agent.cli.args import device_config, state_arguments, trust_arguments
from agent.cli.failure import CliError


def add_parser(commands: Any) -> None:
    """Add ``edge-agent install`` to the subparsers."""
    install = commands.add_parser("install", help="install and activate a bundle on this device")
    install.add_argument("bundle", type=Path)
    install.add_argument(
        "--allow-downgrade",
        action="store_true",
        help="install even if a higher version of this bundle succeeded here (refused otherwise)",
    )
    trust_arguments(install)
    state_arguments(install)


def run(args: argparse.Namespace) -> int:
    from agent.bundles.installer import InstallPolicy, install
    from agent.bundles.store import Store
    from agent.hardware.board import probe

    config = device_config(args)
    if not args.bundle.is_file():
        raise CliError(f"bundle not found: {args.bundle}")
    store = Store(config.state_dir, keep=config.keep_versions, runtimes=config.runtime_settings())
    deployment = install(
        args.bundle,
        store,
        probe(),
        InstallPolicy.from_config(config),
        on_state=lambda d: print(d.state, flush=True),
        allow_downgrade=args.allow_downgrade,
    )
    if deployment.state != State.SUCCEEDED:
        raise CliError(f"{deployment.state}: {deployment.error or 'no error recorded'}")
    print(f"installed {deployment.name} {deployment.version} ({deployment.sha256[:12]}); it is now current")
    return 0
