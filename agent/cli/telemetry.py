"""`edge-agent telemetry`: the board's temperature, power, battery, fan and GPU readings, once
as JSON or text, or as a live table for a technician (docs/telemetry.md).

Reads through the same `SysFS(root)` as the daemon, so ``--root`` shows what a fake or
captured tree would report; ``--config`` adds the optional sources of agent.yaml's
``sensors:`` section (a UPS HAT) and shows the governor's thresholds for this board.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cli.args import number_within, positive_int

if TYPE_CHECKING:
    from agent.hardware.board import Board
    from agent.hardware.readings import SensorReadings


def add_parser(commands: Any) -> None:
    """Add ``edge-agent telemetry`` to the subparsers."""
    telemetry = commands.add_parser(
        "telemetry", help="read the temperature, power, battery, fan and GPU sensors of this board"
    )
    mode = telemetry.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="read once and exit (the default)")
    every = number_within(0.1, 3600, "seconds")
    mode.add_argument("--watch", type=every, metavar="SECONDS", help="read every SECONDS as a live table")
    telemetry.add_argument("--count", type=positive_int, help="with --watch: stop after N readings")
    telemetry.add_argument("--json", action="store_true", help='print {"board": ..., "sensors": ...} (one line each)')
    telemetry.add_argument("--root", type=Path, default=Path("/"), help="filesystem root to read (for fake trees)")
    telemetry.add_argument("--config", type=Path, help="agent.yaml: its sensors section and governor thresholds")


def _fmt(value: float | None, unit: str, digits: int = 1) -> str:
    return "?" if value is None else f"{value:.{digits}f} {unit}"


def render(board: Board, readings: SensorReadings, thresholds: str | None = None) -> str:
    """The readings as a technician's table."""
    lines = [f"board        {board.model} ({board.kind})"]
    zones = readings.thermal_zones
    lines.append(f"temperature  {_fmt(readings.temp_c, '°C')}  (hottest of {len(zones)} zone(s))")
    lines += [f"  {zone.name:<20} {_fmt(zone.temp_c, '°C')}" for zone in zones]
    if thresholds:
        lines.append(f"governor     {thresholds}")
    source = f"  ({readings.power_source})" if readings.power_source else ""
    lines.append(f"power        {_fmt(readings.power_w, 'W', 3)}{source}")
    lines += [
        f"  {r.name:<20} {_fmt(r.voltage_v, 'V', 3):>9} {_fmt(r.current_a, 'A', 3):>9} {_fmt(r.power_w, 'W', 3):>9}"
        for r in readings.rails
    ]
    fan = readings.fan
    lines.append(
        f"fan          {_fmt(fan.duty_percent, '%')}  {_fmt(fan.rpm, 'rpm', 0)}" if fan else "fan          none"
    )
    gpu = readings.gpu
    gpu_line = f"{gpu.name}  load {_fmt(gpu.load_percent, '%')}" if gpu else "none"
    if gpu and gpu.temp_c is not None:
        gpu_line += f"  {_fmt(gpu.temp_c, '°C')}"
    if gpu and gpu.power_w is not None:
        gpu_line += f"  {_fmt(gpu.power_w, 'W', 2)}"
    lines.append(f"gpu          {gpu_line}")
    battery = readings.battery
    lines.append(
        f"battery      {_fmt(battery.percent, '%', 0)} {battery.status or ''}  {_fmt(battery.voltage_v, 'V', 2)}"
        f"  {_fmt(battery.power_w, 'W', 2)}  ({battery.source})"
        if battery
        else "battery      none"
    )
    throttled = readings.throttled
    if throttled is not None:
        flags = [name for name, on in vars(throttled).items() if on is True]
        lines.append(f"throttled    {', '.join(flags) or 'no'}  (0x{throttled.raw:x})")
    lines.append(f"sources      {', '.join(readings.sources) or 'none found'}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from agent.config.loading import load_config
    from agent.config.models import AgentConfig
    from agent.governor.policy import resolve_thresholds
    from agent.hardware.board import probe
    from agent.hardware.sensors import Sensors
    from agent.hardware.sysfs import SysFS

    config = load_config(args.config) if args.config else AgentConfig()
    fs = SysFS(args.root)
    board = probe(fs)
    sensors = Sensors.from_config(config.sensors, fs, board)
    live = args.watch is not None and not args.json and sys.stdout.isatty()
    count = 0
    try:
        while True:
            readings = sensors.read()
            count += 1
            if args.json:
                print(json.dumps({"board": _board_json(board), "sensors": readings.to_json()}), flush=True)
            else:
                t = resolve_thresholds(config.governor.thermal, readings)
                thresholds = f"WARM {t.warm_c:.1f} / HOT {t.hot_c:.1f} / CRITICAL {t.critical_c:.1f} °C"
                thresholds += f" (from {', '.join(dict.fromkeys(t.sources))})"
                print(("\x1b[H\x1b[2J" if live else "") + render(board, readings, thresholds), flush=True)
            if args.watch is None or (args.count is not None and count >= args.count):
                return 0
            if not live and not args.json:
                print()
            time.sleep(args.watch)
    finally:
        sensors.close()


def _board_json(board: Board) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(board)
