"""`edge-agent fleet rollout status|watch|halt|resume ID` and the staging options of `fleet push`
(`--waves`, `--wave-interval`, `--max-failures`, `--on-halt`): staged rollouts, docs/mqtt.md."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from agent.cli.failure import CliError
from agent.mqtt.rollout_schedule import FailureLimit, OnHalt, parse_waves

if TYPE_CHECKING:
    from agent.fleet.rollout_watch import FleetList, Staging, Tally, WaveTally
    from agent.mqtt.link import MqttLink
    from agent.mqtt.protocol import Topics

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """``30s``, ``10m``, ``2h``, ``1d`` or plain seconds."""
    value = text.strip().lower()
    try:
        seconds = float(value[:-1]) * _UNITS[value[-1]] if value[-1:] in _UNITS else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30s, 10m, 2h or 600") from None
    if seconds < 0:
        raise argparse.ArgumentTypeError(f"duration {text!r} is negative")
    return seconds


def _waves(text: str) -> tuple[float, ...]:
    try:
        return tuple(parse_waves(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _failure_limit(text: str) -> FailureLimit:
    try:
        return FailureLimit.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).splitlines()[0]) from None


def add_staging_arguments(push: argparse.ArgumentParser) -> None:
    """The staged-rollout options of `fleet push`."""
    group = push.add_argument_group("staged rollout (a group target; no process has to stay up)")
    group.add_argument(
        "--waves",
        type=_waves,
        metavar="P%,...",
        help="cumulative shares of the group per wave, e.g. 1%%,10%%,50%%,100%%: each device starts when its "
        "wave opens (its wave: a stable hash of deployment and device id)",
    )
    group.add_argument(
        "--wave-interval",
        type=duration,
        default=600.0,
        metavar="DURATION",
        help="time between two waves opening: 30s, 10m, 2h or seconds (default 10m)",
    )
    group.add_argument(
        "--max-failures",
        type=_failure_limit,
        default=FailureLimit(devices=0),
        metavar="N|P%",
        help="halt the rollout when more devices than this fail among those that started (default 0: any failure); "
        "--wait or `fleet rollout watch` publishes the halt",
    )
    group.add_argument(
        "--on-halt",
        choices=get_args(OnHalt),
        default="keep",
        help="on a halt, devices that took it keep it, or roll back (default keep)",
    )
    add_fleet_list_argument(group)  # --wait follows the rollout


def add_fleet_list_argument(parser: argparse._ActionsContainer) -> None:
    """``--devices-file``: the fleet's own list of devices, which the rollout watch trusts."""
    parser.add_argument(
        "--devices-file",
        type=Path,
        default=os.environ.get("EDGE_AGENT_DEVICES_FILE"),
        metavar="FILE",
        help="the fleet's devices as ID[:GROUP] lines (the file `fleet acl` reads; default "
        "$EDGE_AGENT_DEVICES_FILE): only these count in a rollout's tally; reports of any other device are "
        "ignored, so forged ones cannot halt or complete it",
    )


def fleet_list(args: argparse.Namespace, warn: bool = True) -> FleetList | None:
    """The fleet list ``--devices-file`` names, or None (with `warn`, a warning on stderr: every
    reporting device counts, and the watch may sign a halt on their word)."""
    from agent.fleet.rollout_watch import FleetList

    path = getattr(args, "devices_file", None)
    if path is None:
        if not warn:
            return None
        print(
            "edge-agent: warning: no --devices-file: every device reporting this group counts; without the "
            "broker's ACL anyone can forge such reports (docs/security.md)",
            file=sys.stderr,
        )
        return None
    try:
        listed = FleetList.parse(Path(path).read_text().splitlines())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise CliError(f"{path}: {exc}") from exc
    if not listed.devices:
        raise CliError(f"{path} lists no device (ID[:GROUP] lines)")
    return listed


def staging(args: argparse.Namespace) -> Staging | None:
    """The rollout `fleet push` asks for, checked; None without --waves."""
    from agent.fleet.rollout_watch import Staging

    if args.waves is None:
        return None
    if not args.target.startswith("group:"):
        raise CliError(f"--waves stages a rollout over a group: use --target group:NAME, not {args.target!r}")
    from pydantic import ValidationError

    try:
        return Staging(args.waves, args.wave_interval, args.max_failures, args.on_halt)
    except ValidationError as exc:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise CliError(f"--waves {','.join(f'{w:g}%' for w in args.waves)}: {problems}") from None


def add_rollout_commands(fleet_actions: Any) -> tuple[list[argparse.ArgumentParser], list[argparse.ArgumentParser]]:
    """`fleet rollout ACTION ID`; returns (every parser, the ones that sign) for the broker and
    key options."""
    rollout = fleet_actions.add_parser("rollout", help="follow, halt or resume a staged rollout")
    actions = rollout.add_subparsers(dest="rollout_command", required=True, metavar="ACTION")
    status = actions.add_parser("status", help="the rollout's waves and how many devices started, succeeded, failed")
    status.add_argument("--json", action="store_true")
    watch = actions.add_parser("watch", help="follow the rollout; halt it when failures pass its limit")
    watch.add_argument("--timeout", type=duration, default=3600.0, help="stop watching after this long (default 1h)")
    halt = actions.add_parser("halt", help="halt the rollout: devices that did not start do not start")
    halt.add_argument("--reason", default="halted by the operator", help="why (shown to whoever reads the rollout)")
    halt.add_argument(
        "--on-halt", choices=get_args(OnHalt), help="change what devices that took it do (default: the rollout's)"
    )
    resume = actions.add_parser("resume", help="resume a halted rollout where it stood")
    parsers = [status, watch, halt, resume]
    for parser in parsers:
        parser.add_argument("id", help="the deployment id (fleet push prints it)")
    for parser in (status, watch):
        add_fleet_list_argument(parser)
    return parsers, [watch, halt, resume]


def _when(ts: float, now: float) -> str:
    clock = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    return f"{clock} (open)" if ts <= now else f"{clock} (in {_span(ts - now)})"


def _span(seconds: float) -> str:
    return (
        f"{seconds:.0f} s"
        if seconds < 120
        else f"{seconds / 60:.0f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def _ends(wave: WaveTally) -> tuple[str, str, str]:
    return str(wave.succeeded), str(wave.failed), str(wave.running)


def print_tally(current: Tally) -> None:
    now = time.time()
    print(current.summary())
    halted = current.rollout.halted
    if halted is not None:
        print(f"halted at {time.strftime('%H:%M:%S', time.localtime(halted.at))}: {halted.reason}")
    columns = ("WAVE", "SHARE", "OPENS", "DEVICES", "STARTED", "SUCCEEDED", "FAILED", "RUNNING")
    rows = [
        (f"{w.wave}", f"{w.share:g}%", _when(w.opens_at, now), *map(str, (w.devices, w.started)), *_ends(w))
        for w in current.waves
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    for row in (columns, *rows):
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    if current.failed_devices:
        print(f"failed: {', '.join(current.failed_devices)}")
    if current.quality:
        print("quality (shadow before the switch, probation after; the worst camera against its minimum):")
        width = max(len(device) for device, _ in current.quality)
        for device, judged in current.quality:
            print(f"  {device.ljust(width)}  {judged}")
    if current.unreadable:
        print(f"unreadable deployment records (not counted as started): {', '.join(current.unreadable)}")
    if current.ignored:
        print(f"ignored, not the group's in the fleet list (forged, or list them): {', '.join(current.ignored)}")


def follow_rollout(args: argparse.Namespace, link: MqttLink, topics: Topics, deployment_id: str, timeout: float) -> int:
    """Watch a rollout, printing each change; 0 once complete, 1 when halted or still running."""
    from agent.fleet.rollout_watch import watch

    printed: list[str] = []

    def show(current: Tally) -> None:
        line = current.summary()
        if not printed or printed[-1] != line:
            printed.append(line)
            print(line, flush=True)

    fleet = fleet_list(args)
    final = watch(link, topics, deployment_id, args.signing_key, timeout, show, args.listen, fleet=fleet)
    print_tally(final)
    if final.rollout.halted is not None:
        print(f"the rollout is halted; `edge-agent fleet rollout resume {deployment_id}` continues it")
        return 1
    if not final.complete:
        print(f"still running after {_span(timeout)}; its devices go on by themselves (`fleet rollout watch` again)")
        return 1
    return 0


def fleet_rollout(args: argparse.Namespace, link: MqttLink, topics: Topics) -> int:
    """`fleet rollout ACTION ID`."""
    from agent.fleet.rollout_watch import find_rollout, halt, resume, tally
    from agent.fleet.state import fleet_state
    from agent.mqtt.device_documents import DeploymentDocument, Unreadable

    if args.rollout_command == "watch":
        return follow_rollout(args, link, topics, args.id, args.timeout)
    group, desired = find_rollout(link, topics, args.id, args.listen)
    if args.rollout_command == "halt":
        document = halt(link, topics, group, desired, args.signing_key, args.reason, args.on_halt)
        assert document.rollout is not None
        print(f"halted {args.id} on group {group} (devices that took it: {document.rollout.on_halt})")
        return 0
    if args.rollout_command == "resume":
        assert desired.rollout is not None
        was = "resumed" if desired.rollout.halted is not None else "was not halted on the broker; signed again"
        resume(link, topics, group, desired, args.signing_key)
        print(f"{args.id} on group {group}: {was}")
        return 0
    devices = fleet_state(link, topics, args.listen)
    members = [d for d, parts in devices.items() if parts.group == group]
    records = {
        d: parts.deployment
        for d, parts in devices.items()
        if isinstance(parts.deployment, DeploymentDocument) and parts.deployment.id == args.id
    }
    unreadable = [d for d, parts in devices.items() if isinstance(parts.deployment, Unreadable)]
    current = tally(desired, group, members, records, time.time(), unreadable, fleet_list(args, warn=False))
    if args.json:
        summary = {**asdict(current), "exceeded": current.exceeded, "complete": current.complete}
        summary["rollout"] = current.rollout.model_dump(mode="json")
        print(json.dumps(summary, indent=2))
    else:
        print_tally(current)
    return 0
