"""`edge-agent` command line.

Heavy libraries (OpenCV, ONNX Runtime, LiteRT) are imported inside the commands that need them,
so ``edge-agent --help`` and a first detection start fast. Every expected failure ends as one
line on stderr and exit status 1 (2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from agent.config import DeviceConfig
    from agent.probe import Board
    from pipelines.detections import Detections
    from pipelines.labels import Labels
    from runtimes.base import Runtime, RuntimeInfo, RuntimeName
    from runtimes.selection import Choice

log = logging.getLogger("edge_agent")

RUNTIME_CHOICES = ("auto", "tensorrt", "onnxruntime", "litert")
VIDEO_SUFFIXES = frozenset({".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ts", ".mjpeg"})
DECODER_CHOICES = ("auto", "yolov8", "yolov5", "yolox", "ssd")


class CliError(Exception):
    """An error to print as one line, with the exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _unit_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a number within 0..1, got {text!r}") from exc
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number within 0..1, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from exc
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge-agent", description="Edge inference agent for Jetson, Raspberry Pi and Linux boxes."
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    detect = commands.add_parser("detect", help="run a detection model on images")
    detect.add_argument("model", type=Path, metavar="MODEL", help="an .onnx or .tflite model")
    detect.add_argument("images", type=Path, nargs="+", metavar="IMAGE", help="image or video files")
    detect.add_argument("--labels", type=Path, help="labels file, one per line (default: the model's metadata)")
    detect.add_argument("--runtime", choices=RUNTIME_CHOICES, default="auto")
    detect.add_argument("--decoder", choices=DECODER_CHOICES, default="auto")
    detect.add_argument("--conf", type=_unit_interval, default=0.25, help="score threshold (default 0.25)")
    detect.add_argument("--iou", type=_unit_interval, default=0.45, help="NMS IoU threshold (default 0.45)")
    detect.add_argument("--max-det", type=_positive_int, default=300, help="most detections per image")
    detect.add_argument("--save-dir", type=Path, help="also write each image with its boxes drawn, as JPEG, here")
    detect.add_argument("--every", type=_positive_int, default=1, help="videos: detect on every N-th frame")
    detect.add_argument("--json", action="store_true", help="one JSON object per image (or video frame) per line")

    bench = commands.add_parser("bench", help="measure FPS, latency and memory of a model")
    bench.add_argument("model", type=Path, metavar="MODEL", help="an .onnx or .tflite model")
    bench.add_argument("--source", default="synthetic", help="a video file or 'synthetic' (default)")
    bench.add_argument("--frames", type=_positive_int, help="frames to process (default: the whole file, or 300)")
    bench.add_argument("--runtime", choices=RUNTIME_CHOICES, default="auto")
    bench.add_argument(
        "--mode",
        choices=("pipeline", "runtime"),
        default="pipeline",
        help="pipeline: capture to detections, every frame; runtime: inference alone on one prepared tensor",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object")

    keygen = commands.add_parser("keygen", help="create an Ed25519 signing key pair for bundles")
    keygen.add_argument("--out", type=Path, required=True, help="folder for signing.key (0600) and signing.pub")

    bundle = commands.add_parser("bundle", help="build, inspect and verify model bundles")
    bundle_commands = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")
    build = bundle_commands.add_parser("build", help="write a bundle from models")
    build.add_argument("--model", type=Path, action="append", required=True, help=".onnx or .tflite (repeatable)")
    build.add_argument("--labels", type=Path, help="labels file (default: the model's metadata)")
    build.add_argument("--decoder", choices=DECODER_CHOICES, default="auto")
    build.add_argument("--name", help="bundle name (default: the first model's file name)")
    build.add_argument("--version", default="0.1.0", help="semantic version (default 0.1.0)")
    build.add_argument("--description", default="")
    build.add_argument("--calibration", type=Path, help="folder of calibration images (.jpg/.png)")
    build.add_argument("--key", type=Path, help="signing.key to sign the manifest with")
    build.add_argument("-o", "--out", type=Path, required=True, help="bundle file to write")
    inspect = bundle_commands.add_parser("inspect", help="print a bundle's manifest summary")
    inspect.add_argument("bundle", type=Path)
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    verify = bundle_commands.add_parser("verify", help="check a bundle completely without installing it")
    verify.add_argument("bundle", type=Path)
    _trust_arguments(verify)

    install = commands.add_parser("install", help="install and activate a bundle on this device")
    install.add_argument("bundle", type=Path)
    _trust_arguments(install)
    _state_arguments(install)
    rollback = commands.add_parser("rollback", help="return to the previous version")
    _state_arguments(rollback)
    status = commands.add_parser("status", help="current and previous versions, last deployment")
    _state_arguments(status)
    status.add_argument("--json", action="store_true")

    probe = commands.add_parser("probe", help="show the hardware and runtimes found, and the runtime policy's choice")
    probe.add_argument("--json", action="store_true", help="print one JSON object")
    probe.add_argument("--root", type=Path, default=Path("/"), help="filesystem root to probe (for fake trees)")
    probe.add_argument("--arch", help="CPU architecture to assume (default: this machine's)")
    return parser


def _trust_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-key", type=Path, action="append", default=[], help="trusted signing.pub (repeatable)")
    parser.add_argument("--allow-unsigned", action="store_true", help="accept bundles without a valid signature")
    parser.add_argument("--config", type=Path, help="device config (YAML): state_dir, trust_keys, limits, ...")


def _state_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir", type=Path, help="state directory (default: the config's, else /var/lib/edge-agent)"
    )
    if not any(a.dest == "config" for a in parser._actions):
        parser.add_argument("--config", type=Path, help="device config (YAML)")


def _device_config(args: argparse.Namespace) -> DeviceConfig:
    from agent.config import DeviceConfig, load_config

    config = load_config(args.config) if getattr(args, "config", None) else DeviceConfig()
    updates: dict[str, Any] = {}
    if getattr(args, "state_dir", None):
        updates["state_dir"] = args.state_dir
    if getattr(args, "trust_key", None):
        updates["trust_keys"] = [*config.trust_keys, *args.trust_key]
    if getattr(args, "allow_unsigned", False):
        updates["allow_unsigned"] = True
    return config.model_copy(update=updates)


def _select_and_load(model: Path, preference: str, warmup: bool = True) -> tuple[Runtime, Choice]:
    """Rank runtimes for `model` on this board and load the first that works."""
    from agent.probe import probe
    from runtimes.base import RuntimeUnavailable
    from runtimes.registry import available_runtimes, load_runtime
    from runtimes.selection import Artifact, runtimes_for, select_runtimes

    artifacts = [Artifact.from_path(model)]
    available = available_runtimes(runtimes_for(artifacts))
    choices = select_runtimes(probe(), available, artifacts, preference)  # type: ignore[arg-type]
    failures = []
    for choice in choices:
        try:
            runtime = load_runtime(choice.runtime, model, warmup=warmup)
        except RuntimeUnavailable as exc:
            failures.append(f"{choice.runtime}: {exc}")
            log.warning("runtime %s unavailable, trying the next: %s", choice.runtime, exc)
            continue
        log.info("runtime %s on %s: %s", choice.runtime, choice.device, choice.reason)
        return runtime, choice
    raise CliError("no runtime could load the model: " + "; ".join(failures))


def _detection_rows(detections: Detections, labels: Labels) -> list[dict[str, Any]]:
    rows = []
    for box, score, class_id in zip(detections.xyxy, detections.confidence, detections.class_id, strict=True):
        rows.append(
            {
                "label": labels(int(class_id)),
                "class_id": int(class_id),
                "score": round(float(score), 4),
                "box": [round(float(v), 1) for v in box],
            }
        )
    return rows


def cmd_detect(args: argparse.Namespace) -> int:
    from pipelines.detector import Detector
    from pipelines.labels import Labels

    model: Path = args.model
    if not model.is_file():
        raise CliError(f"model file not found: {model}")
    labels = Labels.from_file(args.labels) if args.labels else None
    runtime, choice = _select_and_load(model, args.runtime, warmup=False)  # the first image warms it up
    with runtime:
        detector = Detector(runtime, args.decoder, conf=args.conf, iou=args.iou, max_det=args.max_det)
        if labels is None:
            labels = Labels(runtime.metadata.names or {})
        save = _annotated_writer(args.save_dir, labels) if args.save_dir else None
        status = 0
        for path in args.images:
            frames = _video_frames(path, args.every) if path.suffix.lower() in VIDEO_SUFFIXES else _image_frame(path)
            try:
                for index, image in frames:
                    detections = detector.detect(image)
                    if save is not None:
                        save(path, index, image, detections)
                    rows = _detection_rows(detections, labels)
                    _print_detections(args.json, path, index, runtime.name, choice.device, detector.decoder, rows)
            except CliError as exc:
                print(f"edge-agent: error: {exc}", file=sys.stderr)
                status = 1
    return status


def _annotated_writer(folder: Path, labels: Labels) -> Callable[[Path, int | None, np.ndarray, Detections], None]:
    import cv2

    from pipelines.annotate import BoxAnnotator

    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {folder}: {exc.strerror}") from exc
    annotator = BoxAnnotator(labels)

    def save(path: Path, index: int | None, image: np.ndarray, detections: Detections) -> None:
        name = f"{path.stem}.jpg" if index is None else f"{path.stem}_{index:06d}.jpg"
        if not cv2.imwrite(str(folder / name), annotator.annotate(image, detections)):
            raise CliError(f"cannot write {folder / name}")

    return save


def _image_frame(path: Path) -> Iterator[tuple[int | None, np.ndarray]]:
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR) if path.is_file() else None
    if image is None:
        raise CliError(f"image {path}: {'not found' if not path.exists() else 'cannot be decoded as an image'}")
    yield None, image


def _video_frames(path: Path, every: int) -> Iterator[tuple[int | None, np.ndarray]]:
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
        print(f"  {row['label']:<16} {row['score']:.2f}  ({x1:.0f}, {y1:.0f}) - ({x2:.0f}, {y2:.0f})")


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
    from agent.probe import probe
    from runtimes.registry import available_runtimes

    report = _probe_report(probe(args.root, args.arch), available_runtimes())
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
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from agent.bench import run_bench

    if not args.model.is_file():
        raise CliError(f"model file not found: {args.model}")
    runtime, choice = _select_and_load(args.model, args.runtime)
    with runtime:
        report = run_bench(runtime, args.source, args.frames, args.mode, progress=sys.stderr.isatty() and not args.json)
    report["device"] = choice.device
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"{report['model']} on {report['runtime']} ({choice.device}), {report['mode']} mode, source {report['source']}"
    )
    print(f"  input {report['input_shape']}, {report['frames']} frames in {report['seconds']:.2f} s")
    latency = report["latency_ms"]
    print(f"  fps {report['fps']:.1f}   latency p50 {latency['p50']:.1f} ms  p95 {latency['p95']:.1f} ms")
    for stage, values in report["stages_ms"].items():
        print(f"    {stage:<12} p50 {values['p50']:7.2f} ms  p95 {values['p95']:7.2f} ms")
    print(f"  dropped {report['dropped']}   peak RSS {report['rss_mb']:.0f} MB")
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    from agent.signing import generate_keypair, key_id, load_public_key

    try:
        private, public = generate_keypair(args.out)
    except (FileExistsError, OSError) as exc:
        raise CliError(str(exc)) from exc
    print(f"wrote {private} (keep it secret) and {public} (key id {key_id(load_public_key(public))})")
    return 0


def cmd_bundle(args: argparse.Namespace) -> int:
    return {"build": _bundle_build, "inspect": _bundle_inspect, "verify": _bundle_verify}[args.bundle_command](args)


def _bundle_build(args: argparse.Namespace) -> int:
    from agent.bundle import build_bundle
    from agent.signing import load_private_key
    from pipelines.labels import Labels

    for model in args.model:
        if not model.is_file():
            raise CliError(f"model file not found: {model}")
    labels = None
    if args.labels:
        parsed = Labels.from_file(args.labels)
        labels = [parsed(i) for i in range(max(parsed.names) + 1)] if parsed.names else None
    calibration: list[Path] = []
    if args.calibration:
        if not args.calibration.is_dir():
            raise CliError(f"calibration folder not found: {args.calibration}")
        calibration = sorted(p for p in args.calibration.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        if not calibration:
            raise CliError(f"no .jpg or .png images in {args.calibration}")
    key = load_private_key(args.key) if args.key else None
    manifest = build_bundle(
        args.model,
        args.out,
        name=args.name,
        version=args.version,
        labels=labels,
        decoder=args.decoder,
        calibration=calibration,
        key=key,
        description=args.description,
    )
    signed = "signed" if key else "unsigned"
    print(f"wrote {args.out}: {manifest.name} {manifest.version}, {len(manifest.artifacts)} artifact(s), {signed}")
    return 0


@contextmanager
def _unpacked(bundle: Path) -> Iterator[Path]:
    import tempfile

    from agent.bundle import Limits, unpack

    if not bundle.is_file():
        raise CliError(f"bundle not found: {bundle}")
    with tempfile.TemporaryDirectory(prefix="edge-agent-bundle-") as folder:
        unpack(bundle, Path(folder), Limits())
        yield Path(folder)


def _bundle_inspect(args: argparse.Namespace) -> int:
    from agent.bundle import _read_manifest

    with _unpacked(args.bundle) as folder:
        _, manifest = _read_manifest(folder)
        signed = (folder / "manifest.sig").is_file()
    if args.json:
        print(json.dumps(manifest.model_dump(mode="json")))
        return 0
    print(f"{manifest.name} {manifest.version} ({manifest.task}, decoder {manifest.decoder}), built {manifest.created}")
    print(f"  signed: {'yes' if signed else 'no'}")
    h, w = manifest.input.size
    print(f"  input: {w}x{h} {manifest.input.color}, {manifest.input.resize}")
    more = ", ..." if len(manifest.labels) > 5 else ""
    print(f"  labels: {len(manifest.labels)} ({', '.join(manifest.labels[:5])}{more})")
    for a in manifest.artifacts:
        print(f"  artifact {a.path}: {a.format} {a.precision}, {a.size} bytes, sha256 {a.sha256[:16]}...")
    return 0


def _bundle_verify(args: argparse.Namespace) -> int:
    from agent.bundle import verify_unpacked
    from agent.signing import load_public_key

    config = _device_config(args)
    trusted = [load_public_key(p) for p in config.trust_keys]
    with _unpacked(args.bundle) as folder:
        verified = verify_unpacked(folder, trusted, config.allow_unsigned)
    signer = f"signed by key {verified.signer}" if verified.signer else "UNSIGNED (allowed by --allow-unsigned)"
    print(f"{args.bundle}: OK, {verified.manifest.name} {verified.manifest.version}, {signer}")
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from agent.bundle import Limits
    from agent.deploy import install
    from agent.probe import probe
    from agent.signing import load_public_key
    from agent.store import Store

    config = _device_config(args)
    if not args.bundle.is_file():
        raise CliError(f"bundle not found: {args.bundle}")
    trusted = [load_public_key(p) for p in config.trust_keys]
    store = Store(config.state_dir, keep=config.keep_versions)
    limits = Limits(config.bundle_limits.max_files, config.bundle_limits.max_bytes)
    deployment = install(
        args.bundle,
        store,
        probe(),
        trusted,
        config.allow_unsigned,
        limits,
        config.runtime,
        on_state=lambda d: print(d.state, flush=True),
    )
    if deployment.state != "SUCCEEDED":
        error = deployment.error or {"code": "UNKNOWN", "message": ""}
        raise CliError(f"{deployment.state}: {error['code']}: {error['message']}")
    print(f"installed {deployment.name} {deployment.version} ({deployment.sha256[:12]}); it is now current")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from agent.store import Deployment, Store

    config = _device_config(args)
    store = Store(config.state_dir, keep=config.keep_versions).ensure()
    store.recover()
    try:
        sha = store.rollback()
    except LookupError as exc:
        raise CliError(str(exc)) from exc
    deployment = Deployment(id=f"rollback-{sha[:12]}", sha256=sha, name=None, version=None)
    info = store.info(sha)
    if info:
        deployment.name, deployment.version = info.name, info.version
    deployment.to("ROLLED_BACK")
    store.record(deployment)
    print(f"rolled back to {deployment.name} {deployment.version} ({sha[:12]})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from agent.store import Store

    config = _device_config(args)
    store = Store(config.state_dir, keep=config.keep_versions)
    store.recover()

    def version(sha: str | None) -> dict[str, str] | None:
        info = store.info(sha)
        return {"name": info.name, "version": info.version, "sha256": info.sha256} if info else None

    deployment = store.last_deployment()
    report = {
        "current": version(store.current_sha()),
        "previous": version(store.previous_sha()),
        "deployment": {"state": deployment.state, "error": deployment.error} if deployment else None,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    for key in ("current", "previous"):
        v = report[key]
        print(f"{key + ':':<10} " + (f"{v['name']} {v['version']} ({v['sha256'][:12]})" if v else "none"))  # type: ignore[index]
    if deployment:
        error = f" {deployment.error['code']}: {deployment.error['message']}" if deployment.error else ""
        print(f"{'last:':<10} {deployment.id} {deployment.state}{error}")
    return 0


COMMANDS = {
    "detect": cmd_detect,
    "probe": cmd_probe,
    "bench": cmd_bench,
    "keygen": cmd_keygen,
    "bundle": cmd_bundle,
    "install": cmd_install,
    "rollback": cmd_rollback,
    "status": cmd_status,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from agent.config import ConfigError
    from agent.errors import BundleError
    from pipelines.decoders import DecoderError
    from pipelines.labels import LabelsError
    from pipelines.sources import SourceError
    from runtimes.base import BackendError

    try:
        return COMMANDS[args.command](args)
    except CliError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return exc.status
    except (BackendError, DecoderError, LabelsError, SourceError, ConfigError) as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return 1
    except BundleError as exc:
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file system problem the commands did not anticipate: still one line
        print(f"edge-agent: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
