"""`edge-agent probe`: the board, the runtimes that import here (third-party ones too, and the
runtime plugins left out with why), which runtime the policy would pick for each artifact format
and why, the sensors found and the camera tools.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.hardware.board import Board
    from agent.hardware.readings import SensorReadings
    from runtimes.base import RuntimeInfo, RuntimeName


def add_parser(commands: Any) -> None:
    """Add ``edge-agent probe`` to the subparsers."""
    probe = commands.add_parser(
        "probe",
        help="show the hardware, runtimes, sensors and camera tools found, and the runtime policy's choice",
    )
    probe.add_argument("--json", action="store_true", help="print one JSON object")
    probe.add_argument("--root", type=Path, default=Path("/"), help="filesystem root to probe (for fake trees)")
    probe.add_argument("--arch", help="CPU architecture to assume (default: this machine's)")


def _probe_report(board: Board, runtimes: Mapping[RuntimeName, RuntimeInfo]) -> dict[str, Any]:
    from runtimes.registry import plugins
    from runtimes.selection import Artifact, SelectionError, known_formats, select_runtimes

    choices: dict[str, Any] = {}
    for fmt in known_formats():
        try:
            best = select_runtimes(board, runtimes, [Artifact.from_path(f"model.{fmt}")])[0]
            choices[fmt] = {"runtime": best.runtime, "device": best.device, "reason": best.reason}
        except SelectionError as exc:
            choices[fmt] = {"runtime": None, "device": None, "reason": str(exc)}
    return {
        "board": asdict(board),
        "runtimes": {name: asdict(info) for name, info in runtimes.items()},
        "selection": choices,
        "runtime_plugins": [asdict(plugin) for plugin in plugins()],
    }


def run(args: argparse.Namespace) -> int:
    from agent.config.models import SensorsSection
    from agent.hardware.board import probe
    from agent.hardware.camera_tools import find_camera_tools
    from agent.hardware.sensors import Sensors
    from runtimes.registry import available_runtimes

    board = probe(args.root, args.arch)
    report = _probe_report(board, available_runtimes(root=args.root))
    sensors = Sensors.from_config(SensorsSection(), args.root, board)
    try:
        report["sensors"] = _sensors_found(sensors.read())
    finally:
        sensors.close()
    report["cameras"] = find_camera_tools().to_json()
    if args.json:
        print(json.dumps(report))
        return 0
    board = report["board"]
    gpu = board["gpu_name"] or ("yes" if board["nvidia_gpu"] else "none")
    print(f"board:    {board['model']} ({board['kind']}, {board['arch']}, {board['cpu_count']} CPUs)")
    print(f"gpu:      {gpu}" + (f", L4T {board['l4t_release']}" if board["l4t_release"] else ""))
    print(f"hailo:    {board['hailo'] or 'none'}")
    if board["soc"]:
        print(f"npu:      {board['soc'].upper()} (runtime rknn, .rknn models converted for {board['soc']})")
    print("runtimes:")
    for name, info in report["runtimes"].items():
        if info["available"]:
            print(f"  {name:<12} {info['version'] or '?':<10} {', '.join(info['devices'])}")
        else:
            print(f"  {name:<12} unavailable: {info['reason']}")
    for plugin in report["runtime_plugins"]:
        if plugin["error"]:
            source = plugin["distribution"] or plugin["target"]
            print(f"  {plugin['name']:<12} plugin left out ({source}): {plugin['error']}")
    print("selection:")
    for fmt, choice in report["selection"].items():
        print(f"  .{fmt:<7} -> {choice['runtime'] or 'none'}: {choice['reason']}")
    print("sensors:" + ("" if report["sensors"] else " none found"))
    for source, found in report["sensors"].items():
        print(f"  {source:<12} {found}")
    _print_camera_tools(report["cameras"])
    return 0


def _print_camera_tools(tools: dict[str, Any]) -> None:
    """The camera tools part of ``edge-agent probe`` (docs/cameras.md)."""
    from pipelines.sources.pipe_source import INSTALL_HINTS

    print("camera tools:")
    for key, tool in (("gst", tools["gst_launch"]), ("ffmpeg", tools["ffmpeg"]), ("rpicam", tools["rpicam"])):
        where = f"{tool['version'] or 'version unknown'} ({tool['path']})" if tool["path"] else "not installed"
        print(f"  {tool['name']:<15} {where}" + ("" if tool["path"] else f": {INSTALL_HINTS[key]}"))
    print(f"  GStreamer hardware decoders: {', '.join(tools['gst_hw_decoders']) or 'none'}")
    print(f"  ffmpeg hardware decoders (compiled in): {', '.join(tools['ffmpeg_hw_decoders']) or 'none'}")


def _sensors_found(readings: SensorReadings) -> dict[str, str]:
    """What each sensor source found, in a few words (`edge-agent telemetry` shows the values)."""
    found = {}
    for source in readings.sources:
        if source == "thermal":
            found[source] = f"{len(readings.thermal_zones)} zone(s): " + ", ".join(
                z.name for z in readings.thermal_zones
            )
        elif source in ("ina3221", "pmic", "jtop"):
            found[source] = f"rails {', '.join(r.name for r in readings.rails) or 'none'}"
            if readings.power_source:
                found[source] += f"; board power from {readings.power_source}"
        elif source == "vcgencmd":
            found[source] = "throttling flags, temperature"
        elif source == "fan" and readings.fan is not None:
            found[source] = readings.fan.source
        elif readings.gpu is not None and source in ("devfreq", "nvml"):
            found[source] = f"GPU {readings.gpu.name}"
        elif readings.battery is not None:
            found[source] = f"battery {readings.battery.source}"
    return found
