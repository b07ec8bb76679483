"""`bundle build`'s optimisation options and `bundle inspect`'s agreement table (docs/optimising.md).

The work is `agent.optimise`'s; this module parses, checks the ``build`` extra is installed, and
prints. `agent.optimise` is imported only when a build runs, so the device's commands never load it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from agent.cli.errors import CliError
from runtimes.base import Precision

if TYPE_CHECKING:
    from agent.bundles.archive import ArtifactNotes
    from agent.bundles.manifest import Manifest

_PRECISIONS: tuple[Precision, ...] = get_args(Precision)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


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
        "FP32 on the validation images and left out below --min-agreement (int8 needs --calibration)",
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
