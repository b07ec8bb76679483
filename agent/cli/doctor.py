"""`edge-agent doctor`: every check of the status page's problem list, from a shell
(agent.daemon.checkup), one line each with what to do; exit status 1 when one fails."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agent.paths import DEFAULT_CONFIG

MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}


def add_parser(commands: Any) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check this device: config, state directory, keys, broker, cameras, runtime, sensors, clock",
        description="Run the checks of the status page's problem list from a shell: each line says pass, warn "
        "or fail and what to do. Exit status 1 when a check fails.",
    )
    doctor.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="agent.yaml")
    doctor.add_argument("--json", action="store_true", help='print {"ok", "checks": [{check, status, message, fix}]}')
    doctor.add_argument("--timeout", type=float, default=10.0, help="seconds for the broker and each camera")
    doctor.add_argument("--root", type=Path, default=Path("/"), help="filesystem root of the sensors (fake trees)")


def run(args: argparse.Namespace) -> int:
    import logging

    from agent.daemon.checkup import run_checks

    logging.getLogger("agent.mqtt").setLevel(logging.ERROR)  # the broker's line says it once

    findings = run_checks(args.config, args.root, args.timeout)
    ok = all(f.status != "fail" for f in findings)
    if args.json:
        print(json.dumps({"ok": ok, "checks": [f.to_json() for f in findings]}, indent=2))
        return 0 if ok else 1
    width = max(len(f.check) for f in findings)
    for finding in findings:
        print(f"{MARK[finding.status]}  {finding.check:<{width}}  {finding.message}")
        if finding.fix and finding.status != "pass":
            print(f"      {'':<{width}}  fix: {finding.fix}")
    failed = sum(f.status == "fail" for f in findings)
    warned = sum(f.status == "warn" for f in findings)
    print(f"{failed} failed, {warned} warning(s), {len(findings) - failed - warned} passed")
    return 0 if ok else 1
