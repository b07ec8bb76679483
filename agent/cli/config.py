"""`edge-agent config check|example`: every problem of an agent.yaml with its line, and a working
example with a board's camera recipe (docs/configuration.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from agent.cli.failure import CliError
from agent.config.recipes import RECIPE_NAMES
from agent.paths import DEFAULT_STATE_DIR


def add_parser(commands: Any) -> None:
    """Add ``edge-agent config`` to the subparsers."""
    config = commands.add_parser("config", help="check agent.yaml or print an example")
    actions = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="print every problem of a config file (exit 1 if any)")
    check.add_argument("file", type=Path)
    example = actions.add_parser("example", help="print a working agent.yaml")
    example.add_argument("--device-id", default="cam-01")
    example.add_argument("--group")
    example.add_argument("--broker", default="mqtt://localhost:1883", help="mqtt://HOST:PORT or mqtts://...")
    example.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    example.add_argument(
        "--source",
        default="synthetic",
        help="synthetic, a video file, /dev/videoN, rtsp://..., gst:PIPELINE, ffmpeg:URL_OR_FILE, rpicam:ARGS, "
        f"or a board recipe: {', '.join(RECIPE_NAMES)} (docs/cameras.md)",
    )
    example.add_argument("--trust-key", type=Path, help="signing.pub whose bundles the device accepts")
    example.add_argument(
        "--operator-key", type=Path, help="public key whose signed desired documents and commands the device obeys"
    )
    example.add_argument("--status-listen", metavar="HOST:PORT", help="serve the status page (127.0.0.1:8080)")
    example.add_argument("--status-user", help="the page's user name (needed to listen beyond loopback)")
    example.add_argument("--status-password-file", type=Path, help="file whose first line is the page's password")


def run(args: argparse.Namespace) -> int:
    from agent.config.example import example_config
    from agent.config.loading import check

    if args.config_command == "example":
        _check_status_arguments(args)
        print(
            example_config(
                device_id=args.device_id,
                group=args.group,
                broker=args.broker,
                state_dir=args.state_dir,
                source=args.source,
                trust_key=args.trust_key,
                operator_key=args.operator_key,
                status_listen=args.status_listen,
                status_user=args.status_user,
                status_password_file=args.status_password_file,
            ),
            end="",
        )
        return 0
    problems, warnings = check(args.file)
    if not problems:
        problems += _class_problems(args.file)
        warnings += _camera_warnings(args.file)
    for problem in problems:
        print(problem)
    for warning in warnings:
        print(f"WARNING: {warning}")
    if problems:
        return 1
    print(f"{args.file}: no problems found" + (f" ({len(warnings)} warning(s) above)" if warnings else ""))
    return 0


def _camera_warnings(path: Path) -> list[str]:
    """What stops a configured pipe source from running on this machine (the tools are asked
    only when the config has pipe sources)."""
    from agent.config.loading import load_config
    from agent.hardware.camera_tools import find_camera_tools, source_problems
    from pipelines.sources.pipe_commands import pipe_tool

    cameras = load_config(path).cameras
    if not any(pipe_tool(p.source) for p in cameras):
        return []
    tools = find_camera_tools()
    return [f"camera {p.name}: {problem}" for p in cameras for problem in source_problems(p.source, tools)]


def _class_problems(path: Path) -> list[str]:
    """Names in ``cameras[].classes`` that the version installed in the config's state
    directory lacks, with their lines (nothing to say when no version is installed there or the
    state directory cannot be read)."""
    from agent.bundles.archive import read_manifest
    from agent.bundles.store import Store
    from agent.config.loading import ConfigLines, load_config
    from agent.errors import BundleError
    from agent.serving.camera_filter import class_problems

    config = load_config(path)
    if not any(p.classes for p in config.cameras):
        return []
    store = Store(config.state_dir, config.keep_versions, config.runtime_settings())
    try:
        sha = store.current_sha()
        if sha is None:
            return []
        _, manifest = read_manifest(store.versions / sha)
    except (OSError, BundleError):
        return []
    where = ConfigLines.read(path).where
    return [problem for i, p in enumerate(config.cameras) for problem in class_problems(i, p, manifest, where)]


def _check_status_arguments(args: argparse.Namespace) -> None:
    """The page's arguments make a valid ``status_page`` section, or a `CliError` says why."""
    from pydantic import ValidationError

    from agent.config.models import StatusPageSection
    from agent.errors import validation_problems

    if args.status_listen is None:
        if args.status_user or args.status_password_file:
            raise CliError("--status-user and --status-password-file go with --status-listen HOST:PORT")
        return
    section = {"listen": args.status_listen, "username": args.status_user, "password_file": args.status_password_file}
    try:
        StatusPageSection.model_validate(section)
    except ValidationError as exc:
        problems = [p.split(": ", 1)[-1].removeprefix("Value error, ") for p in validation_problems(exc)]
        raise CliError("--status-listen: " + "; ".join(problems)) from exc
