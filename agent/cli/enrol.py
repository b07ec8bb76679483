"""`edge-agent enrol --claim FILE`: join the fleet with a claim (docs/fleet.md#enrolment)."""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path
from typing import Any

from agent.cli.failure import CliError
from agent.paths import DEFAULT_CONFIG, DEFAULT_STATE_DIR


def add_parser(commands: Any) -> None:
    """Add ``edge-agent enrol`` to the subparsers."""
    enrol = commands.add_parser("enrol", help="join the fleet with a claim: ask, wait for approval, write agent.yaml")
    enrol.add_argument("--claim", type=Path, required=True, help="the claim file the operator made (YAML or JSON)")
    enrol.add_argument(
        "--config", type=Path, default=DEFAULT_CONFIG, help=f"agent.yaml to write (default {DEFAULT_CONFIG})"
    )
    enrol.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"where the device's keys go (default {DEFAULT_STATE_DIR})",
    )
    enrol.add_argument("--device-id", help="the id to ask for (default: the hostname)")
    enrol.add_argument("--group", help="the group to ask for (default: the claim's)")
    enrol.add_argument(
        "--wait", type=float, default=None, metavar="SECONDS", help="give up after this long (default: wait for ever)"
    )


def run(args: argparse.Namespace) -> int:
    import re

    from agent.mqtt.enrol_device import enrol
    from agent.mqtt.enrolment import Claim, EnrolRefused

    device_id = args.device_id or re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())
    try:
        claim = Claim.load(args.claim)

        def waiting(request: Any) -> None:
            print(
                f"asked to join as {request.device_id} (request {request.request_id}); waiting for the operator",
                file=sys.stderr,
            )

        answer = enrol(claim, args.state_dir, args.config, device_id, args.group, wait_s=args.wait, on_request=waiting)
    except EnrolRefused as exc:
        raise CliError(str(exc)) from exc
    print(
        f"enrolled as {answer.device_id}"
        + (f" in group {answer.group}" if answer.group else "")
        + f": wrote {args.config}"
    )
    return 0
