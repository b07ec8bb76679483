"""`edge-agent run`: the daemon (`agent.daemon.agent.Agent`), until SIGTERM."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent.paths import DEFAULT_CONFIG


def add_parser(commands: Any) -> None:
    """Add ``edge-agent run`` to the subparsers."""
    run = commands.add_parser("run", help="run the agent daemon")
    run.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="agent.yaml")
    run.add_argument(
        "--root", type=Path, default=Path("/"), help="filesystem root to probe and read sensors from (for fake trees)"
    )


def run(args: argparse.Namespace) -> int:
    import logging

    from agent.config.loading import load_config
    from agent.daemon.agent import Agent
    from agent.hardware.board import probe

    config = load_config(args.config)
    root = logging.getLogger()
    root.setLevel(min(root.level, logging.getLevelName(config.log_level.upper())))  # -v can only add detail
    agent = Agent(config, probe(args.root), config_path=args.config, root=args.root)
    return agent.run()
