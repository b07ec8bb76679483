"""`edge-agent`: the table of top-level commands and the one place that turns errors into exit codes.

Each command is a module of this room named after it, with ``add_parser(commands)`` (its
argparse subparser) and ``run(args) -> int``; `COMMANDS` lists them in the order ``--help``
shows. Every expected failure ends as one line on stderr and exit status 1 (2 for usage
errors), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import sys
from collections.abc import Sequence
from typing import Any, Protocol

from agent.cli import (
    bench,
    bundle,
    config,
    detect,
    doctor,
    engine,
    fleet,
    install,
    keygen,
    probe,
    rollback,
    run,
    status,
    telemetry,
)
from agent.cli.failure import CliError


class Command(Protocol):
    """A command module: its parser and what it does."""

    def add_parser(self, commands: Any) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


#: every top-level command, by its name, in the order of ``edge-agent --help``
COMMANDS: dict[str, Command] = {
    "detect": detect,
    "bench": bench,
    "probe": probe,
    "keygen": keygen,
    "bundle": bundle,
    "install": install,
    "rollback": rollback,
    "status": status,
    "config": config,
    "run": run,
    "fleet": fleet,
    "engine": engine,
    "telemetry": telemetry,
    "doctor": doctor,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Edge inference agent for Jetson, Raspberry Pi and Linux boxes."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS.values():
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not faulthandler.is_enabled():  # a native library that crashes this process leaves a traceback
        with contextlib.suppress(OSError, ValueError):  # a stderr without a file descriptor
            faulthandler.enable()
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from agent.errors import BundleError, ConfigError
    from pipelines.decoding.decoders import DecoderError
    from pipelines.decoding.labels import LabelsError
    from pipelines.sources.frames import CredentialsFilter, SourceError
    from runtimes.base import BackendError

    for handler in logging.getLogger().handlers:  # no camera password in the journal
        handler.addFilter(CredentialsFilter())

    try:
        return COMMANDS[args.command].run(args)
    except CliError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return exc.status
    # OSError: a file system problem the commands did not anticipate: still one line
    except (BackendError, BundleError, ConfigError, DecoderError, LabelsError, SourceError, OSError) as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
