"""`edge-agent keygen`: an Ed25519 key pair for signing bundles and control (docs/security.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent.cli.failure import CliError


def add_parser(commands: Any) -> None:
    """Add ``edge-agent keygen`` to the subparsers."""
    keygen = commands.add_parser("keygen", help="create an Ed25519 signing key pair for bundles")
    keygen.add_argument("--out", type=Path, required=True, help="folder for signing.key (0600) and signing.pub")


def run(args: argparse.Namespace) -> int:
    from agent.bundles.signing import generate_keypair, key_id, load_public_key

    try:
        private, public = generate_keypair(args.out)
    except (FileExistsError, OSError) as exc:
        raise CliError(str(exc)) from exc
    print(f"wrote {private} (keep it secret) and {public} (key id {key_id(load_public_key(public))})")
    return 0
