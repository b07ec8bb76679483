"""`edge-agent engine build BUNDLE|ONNX`: build a TensorRT engine ahead of time on a device
(docs/tensorrt.md), into the engine cache the daemon serves from, and optionally out to a
file with its tags for ``edge-agent bundle build --engine``."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from agent.cli.args import device_config, positive_int, state_arguments
from agent.cli.failure import CliError
from runtimes.base import Precision

if TYPE_CHECKING:
    from agent.bundles.manifest import Manifest
    from runtimes.tensorrt_build import Profile


def _profile(text: str) -> Profile:
    from runtimes.tensorrt_build import Profile

    try:
        return Profile.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_parser(commands: Any) -> None:
    """Add ``edge-agent engine`` to the subparsers."""
    engine = commands.add_parser("engine", help="TensorRT engines: build them ahead of time on a device")
    actions = engine.add_subparsers(dest="engine_command", required=True, metavar="ACTION")
    build = actions.add_parser(
        "build",
        help="build the TensorRT engine of a bundle (the ONNX artifact the daemon would serve) or of an ONNX model",
    )
    build.add_argument("source", type=Path, metavar="BUNDLE|ONNX")
    build.add_argument(
        "--precision", choices=get_args(Precision), help="default: runtimes.tensorrt.precision of the config (fp16)"
    )
    build.add_argument(
        "--profile",
        type=_profile,
        metavar="N,C,H,W:N,C,H,W:N,C,H,W",
        help="min:opt:max shapes of a dynamic input (default: the bundle's tensorrt_profile, then the config's)",
    )
    build.add_argument("--workspace-mb", type=positive_int, help="builder workspace limit (default: the config's)")
    build.add_argument(
        "--calibration", type=Path, help="ONNX only: folder of .jpg/.png images for INT8 calibration (YOLO input)"
    )
    build.add_argument("--force", action="store_true", help="build even when cached, or after a recorded failure")
    build.add_argument("--out", type=Path, help="also write the engine here, and its tags to OUT.json")
    build.add_argument("--json", action="store_true", help="print one JSON object")
    state_arguments(build)


@contextmanager
def _onnx_of(source: Path) -> Iterator[tuple[Path, Manifest | None, Path | None]]:
    """(the ONNX file, the bundle's manifest, the unpacked bundle folder) of `source`."""
    from agent.bundles.archive import Limits, unpack, verify_unpacked

    if not source.is_file():
        raise CliError(f"not found: {source}")
    if source.suffix.lower() == ".onnx":
        yield source, None, None
        return
    with tempfile.TemporaryDirectory(prefix="edge-agent-engine-") as tmp:
        folder = Path(tmp)
        unpack(source, folder, Limits())
        verified = verify_unpacked(folder, (), allow_unsigned=True)  # hashes checked; nothing is installed
        artifact = _served_artifact(folder, verified.manifest)
        yield artifact, verified.manifest, folder


def _served_artifact(folder: Path, manifest: Manifest) -> Path:
    """The ONNX artifact TensorRT would serve on this board (the runtime policy's choice)."""
    from agent.hardware.board import probe
    from runtimes.registry import available_runtimes
    from runtimes.selection import Artifact, SelectionError, select_runtimes

    artifacts = [Artifact(str(folder / a.path), a.format, a.precision) for a in manifest.artifacts]
    try:
        choice = select_runtimes(probe(), available_runtimes(("tensorrt",)), artifacts, "tensorrt")[0]
    except SelectionError as exc:
        raise CliError(str(exc)) from exc
    return Path(choice.artifact.path)


def _calibration(args: argparse.Namespace, manifest: Manifest | None, folder: Path | None) -> Any:
    from agent.bundles.engine_settings import bundle_calibration, calibration_batches
    from agent.bundles.manifest import InputSpec

    if manifest is not None and folder is not None:
        if args.calibration:
            raise CliError("--calibration is for an ONNX model; a bundle brings its own calibration images")
        return bundle_calibration(folder, manifest)
    if not args.calibration:
        return None
    if not args.calibration.is_dir():
        raise CliError(f"calibration folder not found: {args.calibration}")
    images = sorted(p for p in args.calibration.iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    if not images:
        raise CliError(f"no .jpg or .png images in {args.calibration}")
    height, width = args.profile.opt[2:] if args.profile else (640, 640)
    return calibration_batches(images, InputSpec(size=(height, width), color="RGB", resize="letterbox"))


def _progress(enabled: bool) -> tuple[Any, Any]:
    if not enabled:
        return None, lambda progress: None
    from tqdm import tqdm

    bar = tqdm(total=100, unit="%", leave=False, desc="building")

    def update(progress: Any) -> None:
        bar.set_description(progress.phase[:30])
        bar.n = round(progress.fraction * 100)
        bar.refresh()

    return bar, update


def run(args: argparse.Namespace) -> int:
    from agent.bundles.engine_settings import prebuilt_engines, version_settings
    from runtimes.tensorrt_backend import ProfileSettings, TensorRTConfig
    from runtimes.tensorrt_engines import prepare_engine

    settings = device_config(args).runtime_settings()
    config = settings.of(TensorRTConfig)
    updates: dict[str, Any] = {}
    if args.precision:
        updates["precision"] = args.precision
    if args.workspace_mb:
        updates["workspace_mb"] = args.workspace_mb
    with _onnx_of(args.source) as (onnx, manifest, folder):
        if manifest is not None:
            config = version_settings(settings, manifest).of(TensorRTConfig)
        if args.profile:
            updates["profile"] = ProfileSettings(min=args.profile.min, opt=args.profile.opt, max=args.profile.max)
        config = config.model_copy(update=updates)
        sha256 = next((a.sha256 for a in manifest.artifacts if a.path == onnx.name), None) if manifest else None
        bar, on_progress = _progress(sys.stderr.isatty() and not args.json)
        try:
            prepared = prepare_engine(
                onnx,
                config,
                sha256=sha256,
                calibration=_calibration(args, manifest, folder),
                prebuilt=prebuilt_engines(folder, manifest) if manifest and folder else (),
                on_progress=on_progress,
                force=args.force,
            )
        finally:
            if bar is not None:
                bar.close()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(prepared.path, args.out)
        Path(f"{args.out}.json").write_text(json.dumps(prepared.record.to_json(), indent=2) + "\n")
    record = prepared.record
    report = {
        "how": prepared.how,
        "engine": str(prepared.path),
        "model": onnx.name,
        "key": prepared.key.to_json(),
        "digest": prepared.key.digest,
        "built_precision": record.built_precision,
        "int8_source": record.int8_source,
        "build_seconds": record.build_seconds,
        "notes": list(record.notes),
        "out": str(args.out) if args.out else None,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    took = f" in {record.build_seconds:.1f} s" if prepared.how == "built" and record.build_seconds else ""
    print(f"engine {prepared.how}{took}: {prepared.path}")
    print(f"  {onnx.name}: {prepared.key.describe()}")
    for note in record.notes:
        print(f"  note: {note}")
    if args.out:
        print(f"  copied to {args.out} (tags in {args.out}.json, for `edge-agent bundle build --engine`)")
    return 0
