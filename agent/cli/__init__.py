"""The `edge-agent` command line: argparse, printing and exit codes only; the work is done by
the rooms it calls (`agent.cli.main` assembles the subcommands)."""

from agent.cli.main import main

__all__ = ["main"]
