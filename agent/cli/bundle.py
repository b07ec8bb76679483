"""`edge-agent bundle build|inspect|verify`: signed model bundles at the operator (docs/bundles.md),
with ``bundle build``'s optimisation options and ``inspect``'s agreement table (docs/optimising.md),
and (``build --agent``) signed agent bundles of edge-agent's own wheels (docs/fleet.md#agent-updates).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.decoding.decoders import DECODER_CHOICES

if TYPE_CHECKING:
    from agent.bundles.archive import Trust
    from runtimes.engine_cache import EngineKey
    from runtimes.hailo_device import HEFHeader

from typing import TYPE_CHECKING, get_args

from runtimes.base import Precision
from runtimes.rknn_settings import PLATFORMS as RKNN_PLATFORMS

if TYPE_CHECKING:
    from agent.bundles.archive import ArtifactNotes, ClassifierInput
    from agent.bundles.manifest import Manifest
from agent.cli.args import device_config, positive_int, trust_arguments, unit_interval
from agent.cli.failure import CliError


def add_parser(commands: Any) -> None:
    """Add ``edge-agent bundle`` to the subparsers."""
    bundle = commands.add_parser("bundle", help="build, inspect and verify model bundles and agent bundles")
    bundle_commands = bundle.add_subparsers(dest="bundle_command", required=True, metavar="ACTION")
    build = bundle_commands.add_parser(
        "build", help="write a bundle from models, or (--agent) from edge-agent's wheels"
    )
    build.add_argument("--model", type=Path, action="append", default=[], help=".onnx or .tflite (repeatable)")
    agent = build.add_argument_group("agent bundles (docs/fleet.md#agent-updates)")
    agent.add_argument(
        "--agent", action="store_true", help="an agent bundle: edge-agent's own wheels (--wheel), signed (--key)"
    )
    agent.add_argument(
        "--wheel",
        type=Path,
        action="append",
        default=[],
        help="edge-agent's wheel, and any dependency's whose version it changes (repeatable)",
    )
    agent.add_argument("--python", help="the Python it is for: py3 (any) or e.g. cp311 (default: from the wheels)")
    agent.add_argument(
        "--arch", help="the architecture it is for: any, aarch64, x86_64, ... (default: from the wheels)"
    )
    build.add_argument("--labels", type=Path, help="labels file (default: the model's metadata)")
    build.add_argument(
        "--decoder",
        choices=DECODER_CHOICES,
        default="auto",
        help="output decoder (default auto: from the outputs and the model's metadata; docs/models.md lists exports)",
    )
    build.add_argument("--name", help="bundle name (default: the first model's file name)")
    build.add_argument("--version", default="0.1.0", help="semantic version (default 0.1.0)")
    build.add_argument("--description", default="")
    build.add_argument("--calibration", type=Path, help="folder of calibration images (.jpg/.png)")
    build.add_argument("--key", type=Path, help="signing.key to sign the manifest with")
    build.add_argument(
        "--engine",
        type=Path,
        action="append",
        default=[],
        help="a prebuilt TensorRT engine from `edge-agent engine build --out` (its tags in ENGINE.json; repeatable)",
    )
    build.add_argument(
        "--tvm-target",
        action="append",
        default=[],
        metavar="TARGET",
        help="also the first ONNX model compiled by Apache TVM for TARGET (e.g. 'llvm -mtriple=aarch64-linux-gnu "
        "-mcpu=cortex-a76', or TVM's JSON form), recorded with its target; native code, so loaded only from a "
        "signed bundle where runtimes.tvm.allow_compiled is on (repeatable; pip install 'edge-agent[tvm]', "
        "a cross gcc for another CPU; docs/tvm.md)",
    )
    build.add_argument(
        "--rknn",
        action="append",
        default=[],
        choices=RKNN_PLATFORMS,
        metavar="SOC",
        help="also the first ONNX model converted by rknn-toolkit2 for a Rockchip NPU (rk3588, rk3566, rk3568): "
        "INT8 on --calibration, proven in the toolkit's simulator on --validation against --min-agreement "
        "(repeatable; the toolkit in its own venv, --rknn-python; docs/rknn.md)",
    )
    build.add_argument("--rknn-fp16", action="store_true", help="--rknn converts to FP16 instead of INT8")
    build.add_argument(
        "--hef",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="also a HEF compiled by Hailo's Dataflow Compiler from the first ONNX --model (which ships beside it "
        "as its reference), recorded with the chip its header names (hailo8l, hailo8, hailo1xh: Hailo-10H); "
        "it cannot run here, so no agreement is measured: the device checks its parity before serving it "
        "(repeatable; docs/hailo.md)",
    )
    build.add_argument(
        "--rknn-python",
        type=Path,
        help="the python of the venv holding rknn-toolkit2 (default: $EDGE_AGENT_RKNN_PYTHON)",
    )
    build.add_argument("-o", "--out", type=Path, required=True, help="bundle file to write")
    add_threshold_arguments(build)
    add_classifier_arguments(build)
    add_optimise_arguments(build)
    inspect = bundle_commands.add_parser("inspect", help="print a bundle's manifest summary")
    inspect.add_argument("bundle", type=Path)
    inspect.add_argument("--json", action="store_true", help="print the manifest as JSON")
    verify = bundle_commands.add_parser("verify", help="check a bundle completely without installing it")
    verify.add_argument("bundle", type=Path)
    trust_arguments(verify)


_PRECISIONS: tuple[Precision, ...] = get_args(Precision)


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def run(args: argparse.Namespace) -> int:
    return {"build": _bundle_build, "inspect": _bundle_inspect, "verify": _bundle_verify}[args.bundle_command](args)


def _agent_build(args: argparse.Namespace) -> int:
    """``bundle build --agent``: edge-agent's wheels as a signed agent bundle."""
    from agent.bundles.agent_bundle import build_agent_bundle
    from agent.bundles.signing import load_private_key

    if args.model:
        raise CliError("an agent bundle carries wheels (--wheel), not models (--model)")
    if not args.wheel:
        raise CliError("bundle build --agent needs edge-agent's wheel: --wheel PATH")
    if args.key is None:
        raise CliError("an agent bundle is code: devices install it only signed; give the signing key with --key")
    for wheel in args.wheel:
        if not wheel.is_file():
            raise CliError(f"wheel not found: {wheel}")
    manifest = build_agent_bundle(
        args.wheel,
        args.out,
        load_private_key(args.key),
        python=args.python,
        arch=args.arch,
        description=args.description,
    )
    print(
        f"wrote {args.out}: edge-agent {manifest.version} for {manifest.python} on {manifest.arch}, "
        f"{len(manifest.wheels)} wheel(s), signed"
    )
    return 0


def _bundle_build(args: argparse.Namespace) -> int:
    import tempfile

    from agent.bundles.archive import build_bundle
    from agent.bundles.signing import load_private_key
    from pipelines.decoding.detection_filter import ThresholdChoice
    from pipelines.decoding.labels import Labels

    if args.agent:
        return _agent_build(args)
    if args.wheel or args.python or args.arch:
        raise CliError("--wheel, --python and --arch build agent bundles: add --agent")
    if not args.model:
        raise CliError("bundle build needs at least one --model (or --agent with --wheel)")
    for model in args.model:
        if not model.is_file():
            raise CliError(f"model file not found: {model}")
    labels = None
    if args.labels:
        parsed = Labels.from_file(args.labels)
        labels = [parsed(i) for i in range(max(parsed.names) + 1)] if parsed.names else None
    calibration = image_files(args.calibration, "calibration") if args.calibration else []
    key = load_private_key(args.key) if args.key else None
    engines = [_engine_file(path) for path in args.engine]
    classifier = classifier_input(args)
    targets = tvm_targets(args.tvm_target)
    for hef in args.hef:
        _hef_header(hef)  # a file that is no HEF is refused before any work
    with tempfile.TemporaryDirectory(prefix="edge-agent-build-") as workdir:
        models, notes = prepare_models(args, calibration, Path(workdir))
        modules = tvm_modules(models, targets, Path(workdir)) if targets else []
        if args.rknn:
            converted, rknn_notes = rknn_models(args, models, calibration, Path(workdir))
            modules, notes = [*modules, *converted], {**notes, **rknn_notes}
        modules += hef_files(args.hef, models, Path(workdir))
        manifest = build_bundle(
            models,
            args.out,
            name=args.name or args.model[0].stem,
            version=args.version,
            labels=labels,
            decoder=args.decoder,
            calibration=calibration,
            key=key,
            description=args.description,
            notes=notes,
            engines=engines,
            thresholds=ThresholdChoice(conf=args.conf, iou=args.iou, max_det=args.max_det),
            classifier=classifier,
            modules=modules,
        )
    signed = "signed" if key else "unsigned"
    print(f"wrote {args.out}: {manifest.name} {manifest.version}, {len(manifest.artifacts)} artifact(s), {signed}")
    if manifest.classifier is not None:
        print(f"  second stage: {stage_line(manifest)}")
    return 0


def tvm_targets(texts: list[str]) -> list[dict[str, Any]]:
    """``--tvm-target`` values as TVM's JSON targets; `CliError` names a malformed one."""
    from runtimes.tvm_backend import parse_target

    try:
        return [parse_target(text) for text in texts]
    except ValueError as exc:
        raise CliError(f"--tvm-target: {exc}") from exc


def tvm_modules(models: list[Path], targets: list[dict[str, Any]], workdir: Path) -> list[Path]:
    """The first ONNX model of `models` compiled for each target into `workdir` (one line says so)."""
    from agent.bundles.archive import compile_tvm_modules

    onnx = next((m for m in models if m.suffix == ".onnx"), None)
    if onnx is None:
        raise CliError("--tvm-target compiles an ONNX model: give one")
    print(f"compiling {onnx.name} with TVM for {len(targets)} target(s)...")
    return compile_tvm_modules(onnx, targets, workdir)


def rknn_models(
    args: argparse.Namespace, models: list[Path], calibration: list[Path], workdir: Path
) -> tuple[list[Path], dict[str, ArtifactNotes]]:
    """The first ONNX model of `models` converted for each ``--rknn`` SoC in the toolkit's own
    venv, each proven in its simulator on the validation images (default: the calibration
    images) against ONNX Runtime: one below ``--min-agreement`` is left out, a line says why."""
    from agent.bundles.archive import ArtifactNotes
    from agent.errors import BundleError, ErrorCode
    from agent.optimise.rknn_build import convert, read_images, toolkit_python

    onnx = next((m for m in models if m.suffix == ".onnx"), None)
    if onnx is None:
        raise CliError("--rknn converts an ONNX model: give one")
    validation = image_files(args.validation, "validation") if args.validation else calibration
    if not calibration and not args.rknn_fp16:
        raise BundleError(ErrorCode.CALIBRATION_REQUIRED, "--rknn (INT8) needs --calibration DIR, or --rknn-fp16")
    if not validation:
        raise BundleError(ErrorCode.VALIDATION_REQUIRED, "--rknn is proven before it ships: give --validation DIR")
    python = toolkit_python(args.rknn_python)
    cal, val = read_images(calibration, "calibration"), read_images(validation, "validation")
    kept: list[Path] = []
    notes: dict[str, ArtifactNotes] = {}
    for soc in dict.fromkeys(args.rknn):
        out = workdir / f"{onnx.stem}.{soc}.rknn"
        kind = "fp16" if args.rknn_fp16 else "int8"
        print(f"converting {onnx.name} with rknn-toolkit2 for {soc} ({kind}) and running its simulator...")
        done = convert(onnx, soc, out, python, [] if args.rknn_fp16 else cal, val, args.rknn_fp16, args.decoder)
        agreement = done.measured.agreement
        counts = f"{done.measured.matched} of {done.measured.baseline_detections} ONNX Runtime detections matched"
        if agreement is None or agreement < args.min_agreement:
            shown = "nothing to compare" if agreement is None else f"agreement {agreement:.3f}"
            print(f"{out.name}: left out: {shown} below --min-agreement {args.min_agreement:.2f} ({counts})")
            continue
        print(f"{out.name}: kept: detection agreement {agreement:.3f} in the simulator ({counts})")
        kept.append(out)
        notes[out.name] = ArtifactNotes(agreement=done.measured.to_manifest(onnx.name, args.min_agreement))
    return kept, notes


def hef_files(hefs: list[Path], models: list[Path], workdir: Path) -> list[Path]:
    """Each ``--hef`` copied into `workdir` with its record beside it (`runtimes.hailo_backend.
    write_record`: the chip and compiler release its header names, the first ONNX model of
    `models`, from which it was compiled, as its source); a line per HEF says what it is for and
    that it was not run here. `BundleError` ``UNKNOWN_FORMAT`` naming a file that is no HEF."""
    import shutil

    from agent.errors import BundleError, ErrorCode
    from runtimes.base import ModelLoadError
    from runtimes.hailo_backend import write_record
    from runtimes.hailo_device import hef_family

    if not hefs:
        return []
    onnx = next((m for m in models if m.suffix == ".onnx"), None)
    if onnx is None:
        raise CliError("--hef ships a HEF beside the ONNX model it was compiled from: give it with --model")
    copied: list[Path] = []
    for hef in hefs:
        out = workdir / hef.name
        if out.exists() or out.name == onnx.name:
            raise CliError(f"--hef {hef}: a second file named {hef.name}")
        shutil.copyfile(hef, out)
        try:
            record = write_record(out, onnx)
        except ModelLoadError as exc:  # NotAModelError too: not a HEF, naming the file
            raise BundleError(ErrorCode.UNKNOWN_FORMAT, f"--hef {hef}: {exc}") from exc
        compiler = f"Dataflow Compiler {record.sdk_version}" if record.sdk_version else "compiler release unknown"
        print(
            f"{hef.name}: HEF for {record.hw_arch} (runs on {hef_family(record.hw_arch)}; {compiler}), compiled "
            f"from {onnx.name}: not run here (no Hailo chip), so no agreement measured; the device's parity check "
            "runs it against the ONNX model's reference outputs before it serves"
        )
        copied.append(out)
    return copied


def _hef_header(hef: Path) -> HEFHeader:
    """The header of ``--hef`` `hef`; `CliError` when the file is missing, `BundleError`
    ``UNKNOWN_FORMAT`` naming it when it is not a ``.hef`` or its header is not a HEF's."""
    from agent.errors import BundleError, ErrorCode
    from runtimes.base import ModelLoadError
    from runtimes.hailo_device import read_hef_header

    if not hef.is_file():
        raise CliError(f"HEF file not found: {hef}")
    if hef.suffix.lower() != ".hef":
        raise BundleError(ErrorCode.UNKNOWN_FORMAT, f"--hef {hef}: expected a .hef file")
    try:
        return read_hef_header(hef)
    except ModelLoadError as exc:  # NotAModelError too
        raise BundleError(ErrorCode.UNKNOWN_FORMAT, f"--hef {hef}: {exc}") from exc


def _engine_file(path: Path) -> tuple[Path, EngineKey]:
    """A prebuilt engine and the key in its tags file (``ENGINE.json``)."""
    from runtimes.engine_cache import EngineRecord

    tags = Path(f"{path}.json")
    if not path.is_file() or not tags.is_file():
        raise CliError(f"engine {path} and its tags {tags} are needed (edge-agent engine build --out writes both)")
    try:
        return path, EngineRecord.from_json(json.loads(tags.read_text())).key
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise CliError(f"{tags}: not the tags of an engine ({exc})") from exc


@contextmanager
def _unpacked(bundle: Path, trust: Trust) -> Iterator[Path]:
    """`bundle` unpacked into a temporary folder, its signature checked with `trust` first."""
    import tempfile

    from agent.bundles.archive import Limits, unpack

    if not bundle.is_file():
        raise CliError(f"bundle not found: {bundle}")
    with tempfile.TemporaryDirectory(prefix="edge-agent-bundle-") as folder:
        unpack(bundle, Path(folder), Limits(), trust=trust)
        yield Path(folder)


def _bundle_inspect(args: argparse.Namespace) -> int:
    from agent.bundles.agent_bundle import bundle_kind, read_agent_head
    from agent.bundles.archive import read_bundle_manifest

    if not args.bundle.is_file():
        raise CliError(f"bundle not found: {args.bundle}")
    if bundle_kind(args.bundle) == "agent":
        agent = read_agent_head(args.bundle)
        if args.json:
            print(json.dumps(agent.manifest.model_dump(mode="json")))
            return 0
        print(
            f"agent bundle: edge-agent {agent.manifest.version}, for {agent.manifest.python} on {agent.manifest.arch}"
        )
        print(f"  built {agent.manifest.created}, signed: {'yes' if agent.signature is not None else 'no'}")
        for wheel in agent.manifest.wheels:
            print(f"  wheel {wheel.path}: {wheel.size} bytes, sha256 {wheel.sha256[:16]}...")
        return 0
    head = read_bundle_manifest(args.bundle)  # the manifest alone: nothing else is inflated
    manifest, signed = head.manifest, head.signature is not None
    if args.json:
        print(json.dumps(manifest.model_dump(mode="json")))
        return 0
    print(f"{manifest.name} {manifest.version} ({manifest.task}, decoder {manifest.decoder}), built {manifest.created}")
    print(f"  signed: {'yes' if signed else 'no'}")
    h, w = manifest.input.size
    print(f"  input: {w}x{h} {manifest.input.color}, {manifest.input.resize}")
    more = ", ..." if len(manifest.labels) > 5 else ""
    print(f"  labels: {len(manifest.labels)} ({', '.join(manifest.labels[:5])}{more})")
    t = manifest.thresholds
    print(f"  thresholds: conf {t.conf}, iou {t.iou}, max_det {t.max_det}")
    sizes = {f.path: f.size for f in manifest.files}
    for a in manifest.artifacts:
        weights = f" (+ weights {a.weights}, {sizes[a.weights]} bytes)" if a.weights in sizes else ""
        tool = {"rknn": "rknn-toolkit2", "hef": "Dataflow Compiler"}.get(a.format, "TVM")
        built = " ".join(t for t in (a.target.arch, a.target.target) if t) if a.target else ""
        target = f", for {built} ({tool} {a.target.runtime_version})" if a.target else ""
        print(
            f"  artifact {a.path}: {a.format} {a.precision}, {a.size} bytes{weights}{target}, sha256 {a.sha256[:16]}..."
        )
    for line in agreement_table(manifest):
        print(line)
    if manifest.classifier is not None:
        print(f"  second stage: {stage_line(manifest)}")
        for a in manifest.classifier.artifacts:
            print(f"  classifier {a.path}: {a.format} {a.precision}, {a.size} bytes, sha256 {a.sha256[:16]}...")
    return 0


def stage_line(manifest: Manifest) -> str:
    """One line on the bundle's second stage: its classes, the labels it applies to, how often."""
    stage = manifest.classifier
    assert stage is not None
    more = ", ..." if len(stage.labels) > 5 else ""
    applies = ", ".join(stage.for_labels) if stage.for_labels else "every label"
    return (
        f"classifier of {len(stage.labels)} classes ({', '.join(stage.labels[:5])}{more}) "
        f"for {applies}, every {stage.every_s:g} s"
    )


def _bundle_verify(args: argparse.Namespace) -> int:
    from agent.bundles.archive import Trust, verify_unpacked
    from agent.bundles.signing import load_public_key

    config = device_config(args)
    trusted = [load_public_key(p) for p in config.trust_keys]
    with _unpacked(args.bundle, Trust(trusted, config.allow_unsigned)) as folder:
        verified = verify_unpacked(folder, trusted, config.allow_unsigned)
    signer = f"signed by key {verified.signer}" if verified.signer else "UNSIGNED (allowed by --allow-unsigned)"
    print(f"{args.bundle}: OK, {verified.manifest.name} {verified.manifest.version}, {signer}")
    return 0


def _precisions(text: str) -> tuple[Precision, ...]:
    """``fp32,fp16,int8`` -> the precisions, in the order given; argparse reports a bad one."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in _PRECISIONS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(_PRECISIONS)}, got {text!r}")
    return tuple(name for name in _PRECISIONS if name in names)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {text!r}")
    return value


def add_threshold_arguments(build: argparse.ArgumentParser) -> None:
    """``--conf``, ``--iou``, ``--max-det``: the manifest's thresholds, every camera's defaults
    (agent.yaml's ``cameras[]`` may set its own: docs/configuration.md)."""
    from pipelines.decoding.detection_filter import DEFAULTS as defaults
    from pipelines.decoding.detection_filter import exporter_default

    group = build.add_argument_group(
        "detection thresholds (signed into the manifest: the devices' defaults, which each camera's "
        "cameras[].conf, iou, max_det in agent.yaml override)"
    )
    group.add_argument(
        "--conf",
        type=unit_interval,
        help=f"keep detections scoring above this, 0..1 (default: {exporter_default('conf')})",
    )
    group.add_argument(
        "--iou",
        type=unit_interval,
        help=f"NMS: drop a box overlapping a better one of its class more than this, 0..1 "
        f"(default: {exporter_default('iou')})",
    )
    group.add_argument(
        "--max-det",
        type=positive_int,
        help=f"most detections kept per frame (default {defaults.max_det})",
    )


def add_classifier_arguments(build: argparse.ArgumentParser) -> None:
    """``--classifier``, ``--classify-labels``, ``--classify-for``, ``--classify-every``: the
    bundle's second stage (docs/bundles.md)."""
    group = build.add_argument_group(
        "a second stage (a classifier of each confirmed track's crop; its class goes into the object events)"
    )
    group.add_argument(
        "--classifier",
        type=Path,
        action="append",
        default=[],
        metavar="MODEL",
        help="a classification model (.onnx or .tflite, output (1, nc)); repeat for its variants, e.g. an int8 "
        ".tflite the governor serves when the board runs hot",
    )
    group.add_argument(
        "--classify-labels",
        metavar="LABELS",
        help="the classifier's labels: a,b,c or a labels file, one per line (default: the model's metadata)",
    )
    group.add_argument(
        "--classify-for",
        metavar="LABELS",
        help="classify only tracks of these detector labels, e.g. person,car (default: every label)",
    )
    group.add_argument(
        "--classify-every",
        type=_seconds,
        default=5.0,
        metavar="SECONDS",
        help="classify each live track again after this many seconds (default 5; once when confirmed)",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}")
    return value


def _names(text: str) -> list[str]:
    """``a,b,c`` -> the names, stripped (an empty one is kept, so that it is refused by name)."""
    return [name.strip() for name in text.split(",")]


def classifier_input(args: argparse.Namespace) -> ClassifierInput | None:
    """The second stage `bundle build` was asked for (None without ``--classifier``); raises
    `CliError` for a missing file, empty labels, or ``--classify-*`` without a classifier."""
    from agent.bundles.archive import ClassifierInput
    from pipelines.decoding.labels import Labels

    if not args.classifier:
        given = [f"--{n}" for n in ("classify-labels", "classify-for") if getattr(args, n.replace("-", "_"))]
        if given:
            raise CliError(f"{' and '.join(given)} need --classifier MODEL")
        return None
    for model in args.classifier:
        if not model.is_file():
            raise CliError(f"classifier model file not found: {model}")
        if model.suffix not in (".onnx", ".tflite"):
            raise CliError(f"classifier {model.name}: expected an .onnx or .tflite model")
    if args.classify_labels is None:
        labels = _metadata_labels(args.classifier[0])
    elif Path(args.classify_labels).is_file():
        parsed = Labels.from_file(Path(args.classify_labels))
        labels = [parsed(i) for i in range(max(parsed.names) + 1)] if parsed.names else []
        if not labels:
            raise CliError(f"--classify-labels: the labels file {args.classify_labels} names no label")
    else:
        labels = _names(args.classify_labels)
    if not labels or any(not label for label in labels):
        raise CliError(f"--classify-labels: every label needs a name, got {args.classify_labels!r}")
    wanted = _names(args.classify_for) if args.classify_for is not None else []
    if any(not label for label in wanted):
        raise CliError(f"--classify-for: every label needs a name, got {args.classify_for!r}")
    return ClassifierInput(tuple(args.classifier), tuple(labels), tuple(wanted), args.classify_every)


def _metadata_labels(model: Path) -> list[str]:
    """The class names in a model's metadata, in class order; `CliError` when it has none."""
    from runtimes.registry import load_runtime

    with load_runtime("onnxruntime" if model.suffix == ".onnx" else "litert", model, warmup=False) as runtime:
        names = runtime.metadata.names
    if not names:
        raise CliError(f"{model} has no class names in its metadata: give --classify-labels a,b,c or a file")
    return [names.get(i, str(i)) for i in range(max(names) + 1)]


def add_optimise_arguments(build: argparse.ArgumentParser) -> None:
    """The options of `bundle build` that drive `agent.optimise` (hygiene, variants, the gate)."""
    from agent.optimise import ACTIVATIONS, CALIBRATION_METHODS  # the room's __init__: the standard library only

    group = build.add_argument_group(
        "optimising an ONNX model (needs: pip install 'edge-agent[build]'; see docs/optimising.md)"
    )
    group.add_argument(
        "--precisions",
        type=_precisions,
        metavar="LIST",
        help="variants of the first ONNX model (FP32) to ship, e.g. fp32,fp16,int8; each is proven against "
        "FP32 on the validation images and left out below --min-agreement (int8 needs --calibration; "
        "below it, int8 is made again with the model's head left in float)",
    )
    group.add_argument(
        "--openvino-int8",
        action="store_true",
        help="also the INT8 variant the OpenVINO way: NNCF's quantization into an OpenVINO IR (.xml + .bin), "
        "proven on OpenVINO like the others; the device's autotune serves it where it is the fastest "
        "(needs --precisions, --calibration and pip install 'edge-agent[nncf]'; docs/openvino.md)",
    )
    group.add_argument(
        "--validation", type=Path, help="folder of .jpg/.png images the variants are proven on (default: --calibration)"
    )
    group.add_argument(
        "--calibration-method",
        choices=CALIBRATION_METHODS,
        default="minmax",
        help="how INT8 activation ranges are found from the calibration images (default minmax)",
    )
    group.add_argument(
        "--int8-activations",
        choices=ACTIVATIONS,
        default="symmetric",
        help="symmetric (zero point 0: TensorRT takes it; the default) or asymmetric (ONNX Runtime and LiteRT only, "
        "often closer to FP32 for models with mostly positive activations)",
    )
    group.add_argument(
        "--min-agreement",
        type=_fraction,
        default=0.9,
        help="detection agreement with FP32 (matched boxes at IoU >= 0.5, same label, / FP32 boxes) "
        "a variant needs to ship (default 0.9)",
    )
    group.add_argument(
        "--no-simplify", action="store_true", help="ship ONNX models as given (default: onnxslim when lossless)"
    )


def image_files(folder: Path, role: str) -> list[Path]:
    """The .jpg/.png files of `folder`, sorted; `role` names the option in errors."""
    if not folder.is_dir():
        raise CliError(f"{role} folder not found: {folder}")
    images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not images:
        raise CliError(f"no .jpg or .png images in {folder}")
    return images


def prepare_models(
    args: argparse.Namespace, calibration: list[Path], workdir: Path
) -> tuple[list[Path], dict[str, ArtifactNotes]]:
    """Hygiene (every ONNX model) and, with ``--precisions``, the variants: the models to bundle
    and their notes. Without the ``build`` extra, plain builds go on unchecked (a line says so)."""
    from agent.errors import BundleError, ErrorCode
    from agent.optimise import missing_tools

    models: list[Path] = list(args.model)
    missing = missing_tools()
    if missing:
        install = f"{', '.join(missing)} not installed: pip install 'edge-agent[build]'"
        if args.precisions:
            raise BundleError(ErrorCode.BUILD_TOOLS_MISSING, f"--precisions needs the build tools ({install})")
        if any(path.suffix == ".onnx" for path in models):
            print(f"note: ONNX models not checked or simplified ({install})")
        return models, {}
    from agent.optimise.prepare import Options, prepare

    options = Options(
        precisions=args.precisions or (),
        calibration=tuple(calibration),
        validation=tuple(image_files(args.validation, "validation")) if args.validation else (),
        method=args.calibration_method,
        activations=args.int8_activations,
        min_agreement=args.min_agreement,
        simplify=not args.no_simplify,
        decoder=args.decoder,
        openvino_int8=args.openvino_int8,
    )
    prepared = prepare(models, options, workdir, print)
    return list(prepared.models), dict(prepared.notes)


def agreement_table(manifest: Manifest) -> list[str]:
    """`bundle inspect`'s table of artifacts with their agreement; empty when none was measured."""
    if not any(a.agreement for a in manifest.artifacts):
        return []
    width = max(len(a.path) for a in manifest.artifacts)
    lines = [
        f"  {'artifact':<{width}}  precision  {'bytes':>9}  agreement  matched  extra  max |error|",
    ]
    for a in manifest.artifacts:
        if a.agreement is None:
            lines.append(f"  {a.path:<{width}}  {a.precision:<9}  {a.size:>9}  {'-':>9}")
            continue
        g = a.agreement
        matched = f"{g.matched}/{g.baseline_detections}"
        lines.append(
            f"  {a.path:<{width}}  {a.precision:<9}  {a.size:>9}  {g.detections:>9.3f}  {matched:>7}  {g.extra:>5}"
            f"  {g.max_abs_error:>11.3g}"
        )
    first = next(a.agreement for a in manifest.artifacts if a.agreement)
    lines.append(
        f"  (against {first.baseline} on {first.images} validation images, IoU >= {first.iou}; "
        f"gate {first.min_agreement:.2f})"
    )
    return lines
