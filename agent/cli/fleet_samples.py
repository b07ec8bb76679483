"""`edge-agent fleet samples DEVICE [CAMERA] [--since T] [--out DIR]`: fetch the samples for
retraining a device kept (the signed ``samples`` command, in chunks like a clip) into a dataset
folder in Ultralytics' layout (`agent.fleet.dataset`). One request returns at most what the
device caps (1000 samples, 64 MiB); the command asks again from where the last answer ended until
nothing more remains, or `--max-requests` were made."""

from __future__ import annotations

import argparse
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cli.failure import CliError

if TYPE_CHECKING:
    from agent.mqtt.link import MqttLink
    from agent.mqtt.protocol import Topics

DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
CAMERA = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def since_time(text: str, now: float) -> float:
    """`--since`: Unix seconds, an ISO 8601 time (UTC unless it says), or a duration ago (90m,
    24h, 7d). Raises `argparse.ArgumentTypeError` with what it accepts."""
    duration = DURATION.fullmatch(text.strip())
    if duration:
        return max(0.0, now - float(duration.group(1)) * UNIT_S[duration.group(2)])
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--since {text[:40]!r}: give Unix seconds, an ISO 8601 time (2026-12-06T10:00) or a duration "
                "ago (90m, 24h, 7d)"
            ) from None
        value = (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp()
    if not 0 <= value <= 1e11:
        raise argparse.ArgumentTypeError(f"--since {text[:40]!r} is not a time")
    return value


def add_samples_parser(fleet_actions: Any) -> argparse.ArgumentParser:
    """``fleet samples``: its parser (the broker and key arguments are added by `fleet`)."""
    samples: argparse.ArgumentParser = fleet_actions.add_parser(
        "samples", help="fetch the samples for retraining a device kept into a YOLO dataset folder"
    )
    samples.add_argument("device", help="the device's id")
    samples.add_argument("camera", nargs="?", help="one camera's samples (default: every camera's)")
    samples.add_argument(
        "--since",
        type=lambda text: since_time(text, time.time()),
        default=0.0,
        help="samples kept after this: Unix seconds, ISO 8601 (UTC unless it says) or a duration ago (24h, 7d)",
    )
    samples.add_argument("-o", "--out", type=Path, default=None, help="dataset folder (default: samples-DEVICE)")
    samples.add_argument(
        "--max-requests", type=int, default=20, help="most requests of up to 1000 samples each (default 20)"
    )
    samples.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each answer")
    return samples


def check_samples_arguments(args: argparse.Namespace) -> None:
    """Mistakes in ``fleet samples``' arguments, reported before any broker is contacted."""
    if args.camera is not None and not CAMERA.fullmatch(args.camera):
        raise CliError(f"camera {args.camera[:80]!r}: a camera name holds only letters, digits, '_', '-' and '.'")
    if not 1 <= args.max_requests <= 1000:
        raise CliError(f"--max-requests must be 1 .. 1000, not {args.max_requests}")


def fleet_samples(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    from agent.fleet.client import fetch_chunked
    from agent.fleet.dataset import DatasetError, write_dataset

    since: float = args.since
    out: Path = args.out or Path(f"samples-{args.device}")
    total, more = 0, True
    for _ in range(args.max_requests):
        request: dict[str, Any] = {"since": since} | ({"camera": args.camera} if args.camera else {})
        archive, info = fetch_chunked(
            link,
            topics,
            args.device,
            "samples",
            request,
            "application/x-tar",
            "the samples' archive",
            args.signing_key,
            args.timeout,
            keep=("until",),
        )
        try:
            written = write_dataset(archive, out)
        except DatasetError as exc:
            raise CliError(f"{args.device}: {exc}") from exc
        total += written.samples
        if written.mixed:
            print(f"note: samples of versions {', '.join(written.mixed)} carry other class names than data.yaml's")
        more = bool(info.get("more")) and int(info.get("count", 0)) > 0
        since = float(info["until"])
        if not more:
            break
    print(f"wrote {total} sample(s) from {args.device} into {out} (data.yaml: {len(written.names)} class names)")
    if more:
        print(f"more remain: run again with --since {since}")
    return 0
