"""`edge-agent`: the table of top-level commands and the one place that turns errors into exit codes.

Each command is a module of this room named after it, with ``add_parser(commands)`` (its
argparse subparser) and ``run(args) -> int``; `COMMANDS` lists them in the order ``--help``
shows, and a command line imports only the module of the command it names. Every expected
failure ends as one line on stderr and exit status 1 (2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import logging
import sys
from collections.abc import Sequence
from typing import Any, Protocol, cast

from agent.cli.failure import CliError


class Command(Protocol):
    """A command module: its parser and what it does."""

    def add_parser(self, commands: Any) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


#: every top-level command, by its name, and its module, in the order of ``edge-agent --help``
COMMANDS: dict[str, str] = {
    "detect": "agent.cli.detect",
    "bench": "agent.cli.bench",
    "probe": "agent.cli.probe",
    "keygen": "agent.cli.keygen",
    "bundle": "agent.cli.bundle",
    "install": "agent.cli.install",
    "rollback": "agent.cli.rollback",
    "status": "agent.cli.status",
    "config": "agent.cli.config",
    "run": "agent.cli.run",
    "fleet": "agent.cli.fleet",
    "engine": "agent.cli.engine",
    "telemetry": "agent.cli.telemetry",
    "doctor": "agent.cli.doctor",
}


def command(name: str) -> Command:
    """The module of the command `name` (one of `COMMANDS`), imported now."""
    return cast(Command, importlib.import_module(COMMANDS[name]))


def named_command(argv: Sequence[str]) -> str | None:
    """The command `argv` names, unless help is asked for before it or the name is unknown.

    Only that command's module is imported for it (``detect``'s start-up: the other commands
    import the signing, MQTT and fleet code); no top-level option takes a value, so the first
    word that is not an option is the command."""
    for word in argv:
        if word in ("-h", "--help"):
            return None
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or, with `only`, the parser of that one command (what `main` parses a
    command line with: the full one only for help and errors before a known command)."""
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Edge inference agent for Jetson, Raspberry Pi and Linux boxes."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        command(name).add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    args = build_parser(named_command(words)).parse_args(words)
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
        return command(args.command).run(args)
    except CliError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return exc.status
    # OSError: a file system problem the commands did not anticipate: still one line
    except (BackendError, BundleError, ConfigError, DecoderError, LabelsError, SourceError, OSError) as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
