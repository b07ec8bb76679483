"""`edge-agent`: the parser of every subcommand and the one place that turns errors into exit codes.

Every expected failure ends as one line on stderr and exit status 1 (2 for usage errors),
never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import sys
from collections.abc import Sequence

from agent.cli.bundles import BUNDLE_COMMANDS, add_bundle_commands
from agent.cli.device import DEVICE_COMMANDS, add_device_commands
from agent.cli.doctor import DOCTOR_COMMANDS, add_doctor_commands
from agent.cli.engines import ENGINE_COMMANDS, add_engine_commands
from agent.cli.errors import CliError
from agent.cli.fleet import FLEET_COMMANDS, add_fleet_commands
from agent.cli.inference import INFERENCE_COMMANDS, add_inference_commands
from agent.cli.sensors import SENSOR_COMMANDS, add_sensor_commands

COMMANDS = {
    **INFERENCE_COMMANDS,
    **BUNDLE_COMMANDS,
    **DEVICE_COMMANDS,
    **FLEET_COMMANDS,
    **SENSOR_COMMANDS,
    **ENGINE_COMMANDS,
    **DOCTOR_COMMANDS,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Edge inference agent for Jetson, Raspberry Pi and Linux boxes."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_inference_commands(commands)
    add_bundle_commands(commands)
    add_device_commands(commands)
    add_fleet_commands(commands)
    add_engine_commands(commands)
    add_sensor_commands(commands)
    add_doctor_commands(commands)
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
    from pipelines.decoders import DecoderError
    from pipelines.labels import LabelsError
    from pipelines.sources import SourceError
    from runtimes.base import BackendError

    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return exc.status
    # OSError: a file system problem the commands did not anticipate: still one line
    except (BackendError, BundleError, ConfigError, DecoderError, LabelsError, SourceError, OSError) as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
