"""`edge-agent status`: the current and previous versions on this device and the last deployment."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from agent.cli.args import device_config, state_arguments


def add_parser(commands: Any) -> None:
    """Add ``edge-agent status`` to the subparsers."""
    status = commands.add_parser("status", help="current and previous versions, last deployment")
    state_arguments(status)
    status.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from agent.bundles.store import Store
    from agent.fleet.state import quality_text

    config = device_config(args)
    store = Store(config.state_dir, keep=config.keep_versions, runtimes=config.runtime_settings())
    store.recover()

    def version(sha: str | None) -> dict[str, str] | None:
        info = store.info(sha)
        return {"name": info.name, "version": info.version, "sha256": info.sha256} if info else None

    deployment = store.last_deployment()
    report = {
        "current": version(store.current_sha()),
        "previous": version(store.previous_sha()),
        "deployment": {
            "state": deployment.state,
            "error": asdict(deployment.error) if deployment.error else None,
            "shadow": asdict(deployment.shadow) if deployment.shadow else None,
            "quality": asdict(deployment.quality) if deployment.quality else None,
        }
        if deployment
        else None,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    for key, sha in (("current", store.current_sha()), ("previous", store.previous_sha())):
        info = store.info(sha)
        print(f"{key + ':':<10} " + (f"{info.name} {info.version} ({info.sha256[:12]})" if info else "none"))
    if deployment:
        error = f" {deployment.error}" if deployment.error else ""
        print(f"{'last:':<10} {deployment.id} {deployment.state}{error}")
        if (judged := quality_text(deployment)) is not None:  # the shadow's and probation's verdicts
            print(f"{'quality:':<10} {judged}")
    return 0
