"""`edge-agent`: the table of top-level commands and the one place that turns errors into exit codes.

Each command is a module of this room named after it, with ``add_parser(commands)`` (its
argparse subparser) and ``run(args) -> int``; `COMMANDS` lists them in the order ``--help``
shows, and a command line imports only the module of the command it names. ``--help`` and
``--version`` import none: `SUMMARIES` holds each command's line of ``--help``
(tests/agent/cli/test_main.py checks it against the modules' own parsers), so they start in
argparse's time, not numpy's, pydantic's or the registry's. Every expected failure ends as one
line on stderr and exit status 1 (2 for usage errors), never a traceback.
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
    "upgrade": "agent.cli.upgrade",
    "status": "agent.cli.status",
    "config": "agent.cli.config",
    "run": "agent.cli.run",
    "fleet": "agent.cli.fleet",
    "enrol": "agent.cli.enrol",
    "engine": "agent.cli.engine",
    "telemetry": "agent.cli.telemetry",
    "doctor": "agent.cli.doctor",
}

#: each command's line in ``edge-agent --help``, as its module's ``add_parser`` words it
SUMMARIES: dict[str, str] = {
    "detect": "run a detection, segmentation, pose, oriented-box or classification model on images",
    "bench": "measure FPS, latency and memory of a model, or with --matrix every way to run a bundle",
    "probe": "show the hardware, runtimes, sensors and camera tools found, and the runtime policy's choice",
    "keygen": "create an Ed25519 signing key pair for bundles",
    "bundle": "build, inspect and verify model bundles and agent bundles",
    "install": "install and activate a bundle on this device",
    "rollback": "return to the previous version",
    "upgrade": "update edge-agent itself on this device from wheels",
    "status": "current and previous versions, last deployment",
    "config": "check agent.yaml or print an example",
    "run": "run the agent daemon (enrolling first when agent.yaml has a claim and no broker)",
    "fleet": "push bundles to devices and watch them (operator side)",
    "enrol": "join the fleet with a claim: ask, wait for approval, write agent.yaml",
    "engine": "TensorRT engines: build them ahead of time on a device",
    "telemetry": "read the temperature, power, battery, fan and GPU sensors of this board",
    "doctor": "check this device: config, state directory, keys, broker, cameras, runtime, sensors, clock",
}


class _Version(argparse.Action):
    """``--version``: `agent.__version__`, printed on stdout as argparse's own version action."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from agent import __version__

        print(f"edge-agent {__version__}")
        parser.exit()


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


def _top_parser() -> tuple[argparse.ArgumentParser, Any]:
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Edge inference agent for Jetson, Raspberry Pi and Linux boxes."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("--version", action=_Version, help="print the version of edge-agent and exit")
    return parser, parser.add_subparsers(dest="command", required=True, metavar="COMMAND")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, every command's module imported, or, with `only`, the parser of that one
    command (what `main` parses a command line naming a command with)."""
    parser, commands = _top_parser()
    for name in COMMANDS if only is None else (only,):
        command(name).add_parser(commands)
    return parser


def summary_parser() -> argparse.ArgumentParser:
    """The top level alone, each command a name and its `SUMMARIES` line, no module imported: what
    `main` parses with when no known command comes first (``--help``, ``--version``, a usage
    error), all of which end in argparse. Its help is the whole parser's, word for word."""
    parser, commands = _top_parser()
    for name in COMMANDS:
        commands.add_parser(name, help=SUMMARIES[name], add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    named = named_command(words)
    args = (build_parser(named) if named is not None else summary_parser()).parse_args(words)
    if not faulthandler.is_enabled():  # a native library that crashes this process leaves a traceback
        with contextlib.suppress(OSError, ValueError):  # a stderr without a file descriptor
            faulthandler.enable()
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from pipelines.sources.frames import CredentialsFilter

    for handler in logging.getLogger().handlers:  # no camera password in the journal
        if not any(isinstance(f, CredentialsFilter) for f in handler.filters):  # once, however often main runs
            handler.addFilter(CredentialsFilter())

    try:
        return command(args.command).run(args)
    except CliError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if not isinstance(exc, expected_errors()):
            raise
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return 1


def expected_errors() -> tuple[type[Exception], ...]:
    """The agent's own errors that end a command as one line, imported only when one is raised
    (`runtimes.base` alone imports numpy and pydantic, which ``keygen`` never needs); OSError: a
    file system problem the commands did not anticipate, still one line."""
    from agent.errors import BundleError, ConfigError
    from pipelines.decoding.decoders import DecoderError
    from pipelines.decoding.labels import LabelsError
    from pipelines.sources.frames import SourceError
    from runtimes.base import BackendError

    return (BackendError, BundleError, ConfigError, DecoderError, LabelsError, SourceError, OSError)
