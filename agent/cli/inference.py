"""`edge-agent detect`, `bench` and `probe`: a model on images, video or a synthetic camera,
and what this device can run.

Heavy libraries (OpenCV, ONNX Runtime, LiteRT) are imported inside the commands that need them,
so ``edge-agent --help`` and a first detection start fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from agent.cli.args import line_points, positive_int, unit_interval
from agent.cli.errors import CliError
from pipelines.decoders import DECODER_CHOICES
from runtimes.selection import Preference

if TYPE_CHECKING:
    import numpy.typing as npt

    from agent.hardware.probe import Board
    from agent.hardware.readings import SensorReadings
    from pipelines.analytics import SceneAnalytics
    from pipelines.detections import Detections
    from pipelines.labels import Labels
    from runtimes.base import RuntimeInfo, RuntimeName

RUNTIME_CHOICES: tuple[str, ...] = get_args(Preference)
VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ts", ".mjpeg"})


def add_inference_commands(commands: Any) -> None:
    """Add detect, bench and probe to the `edge-agent` subparsers."""
    detect = commands.add_parser("detect", help="run a detection model on images")
    detect.add_argument("model", type=Path, metavar="MODEL", help="an .onnx or .tflite model")
    detect.add_argument("images", type=Path, nargs="+", metavar="IMAGE", help="image or video files")
    detect.add_argument("--labels", type=Path, help="labels file, one per line (default: the model's metadata)")
    detect.add_argument("--runtime", choices=RUNTIME_CHOICES, default="auto")
    detect.add_argument(
        "--decoder",
        choices=DECODER_CHOICES,
        default="auto",
        help="output decoder (default auto: from the outputs and the model's metadata; docs/models.md lists exports)",
    )
    detect.add_argument("--conf", type=unit_interval, default=0.25, help="score threshold (default 0.25)")
    detect.add_argument("--iou", type=unit_interval, default=0.45, help="NMS IoU threshold (default 0.45)")
    detect.add_argument("--max-det", type=positive_int, default=300, help="most detections per image")
    detect.add_argument("--save-dir", type=Path, help="also write each image with its boxes drawn, as JPEG, here")
    detect.add_argument("--every", type=positive_int, default=1, help="videos: detect on every N-th frame")
    detect.add_argument("--json", action="store_true", help="one JSON object per image (or video frame) per line")
    detect.add_argument(
        "--track",
        action="store_true",
        help="follow objects across each video's frames: a tracker_id on each detection, and a last summary line",
    )
    detect.add_argument(
        "--line",
        type=line_points,
        action="append",
        default=[],
        metavar="X1,Y1,X2,Y2",
        help="with --track: count crossings of this line (pixels; forward = from the left of point 1 -> point 2 "
        "to its right, as seen on the image); repeat for more lines",
    )

    bench = commands.add_parser(
        "bench", help="measure FPS, latency and memory of a model, or with --matrix every way to run a bundle"
    )
    bench.add_argument(
        "model", type=Path, metavar="MODEL|BUNDLE", help="an .onnx or .tflite model; a bundle with --matrix"
    )
    bench.add_argument(
        "--source",
        default="synthetic",
        help="a video file, 'synthetic' (default), or a pipe source: 'gst:PIPELINE', 'ffmpeg:URL_OR_FILE', "
        "'rpicam:ARGS' (docs/cameras.md)",
    )
    bench.add_argument("--frames", type=positive_int, help="frames to process (default: the whole file, or 300)")
    bench.add_argument("--runtime", choices=RUNTIME_CHOICES, default="auto")
    bench.add_argument(
        "--mode",
        choices=("pipeline", "runtime"),
        default="pipeline",
        help="pipeline: capture to detections, every frame; runtime: inference alone on one prepared tensor",
    )
    bench.add_argument(
        "--workers",
        type=workers_arg,
        default="auto",
        help="inference calls in flight at once on one model (ONNX Runtime only): more throughput, each frame "
        "slower; each call gets cores/N threads. auto (default): the faster of 1 and 2 calls, measured briefly, "
        "as the daemon's autotune chooses",
    )
    bench.add_argument(
        "--matrix",
        action="store_true",
        help="the optimisation report of a bundle: every runtime x artifact / precision / provider / delegate "
        "on this device, each in its own process, with latency, FPS, peak RSS, energy and parity",
    )
    bench.add_argument("--config", type=Path, help="device config (YAML) for the runtimes' settings (--matrix)")
    bench.add_argument("--json", action="store_true", help="print one JSON object (--matrix: a list of rows)")

    probe = commands.add_parser(
        "probe",
        help="show the hardware, runtimes, sensors and camera tools found, and the runtime policy's choice",
    )
    probe.add_argument("--json", action="store_true", help="print one JSON object")
    probe.add_argument("--root", type=Path, default=Path("/"), help="filesystem root to probe (for fake trees)")
    probe.add_argument("--arch", help="CPU architecture to assume (default: this machine's)")


def _detection_rows(detections: Detections, labels: Labels) -> list[dict[str, Any]]:
    rows = []
    for i, (box, score, class_id) in enumerate(
        zip(detections.xyxy, detections.confidence, detections.class_id, strict=True)
    ):
        row = {
            "label": labels(int(class_id)),
            "class_id": int(class_id),
            "score": round(float(score), 4),
            "box": [round(float(v), 1) for v in box],
        }
        if detections.tracker_id is not None:  # --track: null until a track is confirmed
            row["tracker_id"] = int(detections.tracker_id[i]) if detections.tracker_id[i] >= 0 else None
        rows.append(row)
    return rows


class _Tracking:
    """``detect --track``: one tracker (and the `--line` counters) per input file; the summary
    adds them up over the files."""

    def __init__(self, lines: list[tuple[float, float, float, float]]) -> None:
        self.lines, self.tracks = lines, 0
        self.counts = [[0, 0] for _ in lines]
        self.scene: SceneAnalytics | None = None

    def start(self) -> None:
        from pipelines.analytics import SceneAnalytics
        from pipelines.zones import LineSpec

        self.finish()
        specs = [LineSpec(f"line{i}", (x1, y1), (x2, y2)) for i, (x1, y1, x2, y2) in enumerate(self.lines)]
        self.scene = SceneAnalytics("detect", lines=specs)

    def update(self, index: int, image: npt.NDArray[Any], detections: Detections) -> Detections:
        from pipelines.sources import Frame

        if self.scene is None:
            raise RuntimeError("_Tracking.start() must come before update()")
        return self.scene.update(Frame(index, float(index), image), detections).detections

    def finish(self) -> None:
        if self.scene is None:
            return
        self.tracks += self.scene.tracker.confirmed
        for total, count in zip(self.counts, self.scene.counts().lines, strict=True):
            total[0] += count.forward
            total[1] += count.backward
        self.scene = None

    def summary(self) -> dict[str, Any]:
        self.finish()
        lines = [
            {"points": [[x1, y1], [x2, y2]], "forward": f, "backward": b}
            for (x1, y1, x2, y2), (f, b) in zip(self.lines, self.counts, strict=True)
        ]
        return {"summary": {"tracks": self.tracks, "lines": lines}}


def cmd_detect(args: argparse.Namespace) -> int:
    from agent.serving.loader import load_model
    from pipelines.detector import Detector
    from pipelines.labels import Labels

    model: Path = args.model
    if not model.is_file():
        raise CliError(f"model file not found: {model}")
    if args.line and not args.track:
        raise CliError("--line counts tracked objects: add --track")
    tracking = _Tracking(args.line) if args.track else None
    labels = Labels.from_file(args.labels) if args.labels else None
    runtime, choice = load_model(model, args.runtime, warmup=False)  # the first image warms it up
    with runtime:
        detector = Detector(runtime, args.decoder, conf=args.conf, iou=args.iou, max_det=args.max_det)
        if labels is None:
            labels = Labels(runtime.metadata.names or {})
        save = _annotated_writer(args.save_dir, labels) if args.save_dir else None
        status = 0
        for path in args.images:
            frames = _video_frames(path, args.every) if path.suffix.lower() in VIDEO_SUFFIXES else _image_frame(path)
            if tracking is not None:
                tracking.start()
            try:
                for index, image in frames:
                    detections = detector.detect(image)
                    if tracking is not None:
                        detections = tracking.update(index or 0, image, detections)
                    if save is not None:
                        save(path, index, image, detections)
                    rows = _detection_rows(detections, labels)
                    _print_detections(args.json, path, index, runtime.name, choice.device, detector.decoder, rows)
            except CliError as exc:
                print(f"edge-agent: error: {exc}", file=sys.stderr)
                status = 1
        if tracking is not None:
            _print_summary(args.json, tracking.summary())
    return status


def _print_summary(as_json: bool, summary: dict[str, Any]) -> None:
    if as_json:
        print(json.dumps(summary), flush=True)
        return
    print(f"summary: {summary['summary']['tracks']} object(s) tracked")
    for line in summary["summary"]["lines"]:
        (x1, y1), (x2, y2) = line["points"]
        print(f"  line ({x1:g}, {y1:g}) -> ({x2:g}, {y2:g}): {line['forward']} forward, {line['backward']} backward")


def _annotated_writer(folder: Path, labels: Labels) -> Callable[[Path, int | None, npt.NDArray[Any], Detections], None]:
    import cv2

    from pipelines.annotate import BoxAnnotator

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {folder}: {exc.strerror}") from exc
    annotator = BoxAnnotator(labels)

    def save(path: Path, index: int | None, image: npt.NDArray[Any], detections: Detections) -> None:
        name = f"{path.stem}.jpg" if index is None else f"{path.stem}_{index:06d}.jpg"
        if not cv2.imwrite(str(folder / name), annotator.annotate(image, detections)):
            raise CliError(f"cannot write {folder / name}")

    return save


def _image_frame(path: Path) -> Iterator[tuple[int | None, npt.NDArray[Any]]]:
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR) if path.is_file() else None
    if image is None:
        raise CliError(f"image {path}: {'not found' if not path.exists() else 'cannot be decoded as an image'}")
    yield None, image


def _video_frames(path: Path, every: int) -> Iterator[tuple[int | None, npt.NDArray[Any]]]:
    from pipelines.sources import FileSource, SourceError

    source = FileSource(path)
    try:
        source.open()
        while (frame := source.read()) is not None:
            if frame.index % every == 0:
                yield frame.index, frame.image
    except SourceError as exc:
        raise CliError(str(exc)) from exc
    finally:
        source.close()


def _print_detections(
    as_json: bool, path: Path, frame: int | None, runtime: str, device: str, decoder: str, rows: list[dict[str, Any]]
) -> None:
    if as_json:
        record: dict[str, Any] = {"image": str(path)}
        if frame is not None:
            record["frame"] = frame
        record.update(runtime=runtime, decoder=decoder, detections=rows)
        print(json.dumps(record), flush=True)
        return
    where = f"{path}" if frame is None else f"{path} frame {frame}"
    print(f"{where}: {len(rows)} detection(s) [{runtime} on {device}, {decoder}]")
    for row in rows:
        x1, y1, x2, y2 = row["box"]
        track = f"  #{row['tracker_id']}" if row.get("tracker_id") is not None else ""
        print(f"  {row['label']:<16} {row['score']:.2f}  ({x1:.0f}, {y1:.0f}) - ({x2:.0f}, {y2:.0f}){track}")


def _probe_report(board: Board, runtimes: Mapping[RuntimeName, RuntimeInfo]) -> dict[str, Any]:
    from runtimes.selection import Artifact, SelectionError, select_runtimes

    choices: dict[str, Any] = {}
    for fmt in ("onnx", "tflite"):
        try:
            best = select_runtimes(board, runtimes, [Artifact.from_path(f"model.{fmt}")])[0]
            choices[fmt] = {"runtime": best.runtime, "device": best.device, "reason": best.reason}
        except SelectionError as exc:
            choices[fmt] = {"runtime": None, "device": None, "reason": str(exc)}
    return {
        "board": asdict(board),
        "runtimes": {name: asdict(info) for name, info in runtimes.items()},
        "selection": choices,
    }


def cmd_probe(args: argparse.Namespace) -> int:
    from agent.config.models import SensorsSection
    from agent.hardware.camera_tools import find_camera_tools
    from agent.hardware.probe import probe
    from agent.hardware.sensors import Sensors
    from runtimes.registry import available_runtimes

    board = probe(args.root, args.arch)
    report = _probe_report(board, available_runtimes())
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
    print("runtimes:")
    for name, info in report["runtimes"].items():
        if info["available"]:
            print(f"  {name:<12} {info['version'] or '?':<10} {', '.join(info['devices'])}")
        else:
            print(f"  {name:<12} unavailable: {info['reason']}")
    print("selection:")
    for fmt, choice in report["selection"].items():
        print(f"  .{fmt:<7} -> {choice['runtime'] or 'none'}: {choice['reason']}")
    print("sensors:" + ("" if report["sensors"] else " none found"))
    for source, found in report["sensors"].items():
        print(f"  {source:<12} {found}")
    _print_camera_tools(report["cameras"])
    return 0


def workers_arg(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def _print_camera_tools(tools: dict[str, Any]) -> None:
    """The camera tools part of ``edge-agent probe`` (docs/cameras.md)."""
    from pipelines.pipe_source import INSTALL_HINTS

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


def cmd_bench(args: argparse.Namespace) -> int:
    from agent.cli.report import auto_workers, bench_matrix
    from agent.serving.loader import load_model
    from pipelines.bench import run_bench

    if args.matrix:
        return bench_matrix(args)
    if not args.model.is_file():
        raise CliError(f"model file not found: {args.model}")
    workers, measured = auto_workers(args.model, args.runtime) if args.workers == "auto" else (args.workers, {})
    runtime, choice = load_model(args.model, args.runtime, workers=workers)
    with runtime:
        if workers > 1 and not runtime.concurrent:
            raise CliError(f"--workers {workers}: {runtime.name} cannot run one model from several threads")
        progress = sys.stderr.isatty() and not args.json
        report = run_bench(runtime, args.source, args.frames, args.mode, progress=progress, workers=workers)
    report["device"] = choice.device
    if measured:
        report["workers_auto_fps"] = measured
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"{report['model']} on {report['runtime']} ({choice.device}), {report['mode']} mode, source {report['source']}"
    )
    auto = f" (auto; FPS by workers: {measured})" if measured else ""
    print(
        f"  input {report['input_shape']}, {report['frames']} frames in {report['seconds']:.2f} s, "
        f"{report['workers']} worker(s){auto}"
    )
    latency = report["latency_ms"]
    print(f"  fps {report['fps']:.1f}   latency p50 {latency['p50']:.1f} ms  p95 {latency['p95']:.1f} ms")
    for stage, values in report["stages_ms"].items():
        print(f"    {stage:<12} p50 {values['p50']:7.2f} ms  p95 {values['p95']:7.2f} ms")
    print(f"  dropped {report['dropped']}   peak RSS {report['rss_mb']:.0f} MB")
    return 0


INFERENCE_COMMANDS = {"detect": cmd_detect, "probe": cmd_probe, "bench": cmd_bench}
