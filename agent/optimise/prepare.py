"""`bundle build`'s optimisation pipeline: models in, the artifacts to bundle out (docs/optimising.md).

`prepare(models, options, workdir, say)`:

1. every ONNX model: checked (`hygiene.check_model`), described (opset, IR, dynamic axes,
   operators TensorRT or LiteRT cannot take) and simplified when that keeps its outputs identical;
2. with `Options.precisions`, the first ONNX model (it must be FP32) becomes its variants: FP16
   and INT8 Q/DQ (`variants`), and with `Options.openvino_int8` an INT8 OpenVINO IR made by
   NNCF (`nncf_int8`), each run against the FP32 model on the validation images
   (`agreement.measure`; the IR on OpenVINO, the others on ONNX Runtime); a variant below
   `Options.min_agreement` is left out, with a line saying by how much it missed;
3. returns the files for `agent.bundles.archive.build_bundle` with `ArtifactNotes` (precision,
   agreement) for the manifest.

Files it makes go into `workdir` (the caller's temporary folder). Progress and verdicts go to
`say`, one line each. Runs in the calling thread, on the operator's machine only: the device never
imports this room (an import-linter contract and a test keep it so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy.typing as npt

from agent.bundles.archive import ArtifactNotes, reference_frame
from agent.errors import BundleError, ErrorCode
from agent.optimise import Activations, CalibrationMethod
from agent.optimise.agreement import Measured, measure
from agent.optimise.hygiene import check_model, describe, simplify
from agent.optimise.variants import COMPUTE_OPS, quantize_qdq, to_fp16
from pipelines.decoding.decoders import DecoderError
from pipelines.decoding.detector import Detector
from runtimes.base import BackendError, Precision
from runtimes.openvino_backend import model_files
from runtimes.registry import load_runtime

Say = Callable[[str], None]
_INT8_HINT = (
    "; another --calibration-method, --int8-activations asymmetric, or calibration images closer to the "
    "camera's may do better"
)


@dataclass(frozen=True)
class Options:
    """What the operator asked of `bundle build`.

    `precisions`: the variants to ship of the first ONNX model (empty: ship the models as given,
    after the hygiene). `calibration`: images for INT8; `validation`: images the variants are
    proven on (default: the calibration images). `min_agreement`: 0..1, the detection agreement
    a variant needs to ship. `openvino_int8`: also the INT8 variant the OpenVINO way (NNCF, an
    OpenVINO IR), beside the `precisions`.
    """

    precisions: tuple[Precision, ...] = ()
    calibration: tuple[Path, ...] = ()
    validation: tuple[Path, ...] = ()
    method: CalibrationMethod = "minmax"
    activations: Activations = "symmetric"
    min_agreement: float = 0.9
    simplify: bool = True
    decoder: str = "auto"
    openvino_int8: bool = False

    @property
    def proof_images(self) -> tuple[Path, ...]:
        return self.validation or self.calibration


@dataclass(frozen=True)
class Prepared:
    """The files to bundle, in order, and what the manifest should say of each (by file name)."""

    models: tuple[Path, ...]
    notes: Mapping[str, ArtifactNotes] = field(default_factory=dict)


def check_options(models: Sequence[Path], options: Options) -> None:
    """Refuse what cannot work before any model is loaded: a variant without images to prove it
    on, INT8 without calibration images, precisions without an ONNX model, the OpenVINO INT8
    variant without `precisions` or without NNCF and OpenVINO installed."""
    if options.openvino_int8:
        from agent.optimise.nncf_int8 import missing_tools

        if not options.precisions:
            raise BundleError(
                ErrorCode.NOT_FP32_MODEL,
                "--openvino-int8 is a variant of the FP32 model: give --precisions too (fp32 ships the FP32 model "
                "beside it, e.g. --precisions fp32,int8)",
            )
        if not options.calibration:
            raise BundleError(
                ErrorCode.CALIBRATION_REQUIRED,
                "--openvino-int8 needs calibration images: --calibration DIR with .jpg/.png frames like the camera's",
            )
        if missing := missing_tools():
            raise BundleError(
                ErrorCode.BUILD_TOOLS_MISSING,
                f"--openvino-int8 needs {' and '.join(missing)}: pip install 'edge-agent[nncf]'",
            )
    if not options.precisions:
        return
    if not any(path.suffix == ".onnx" for path in models):
        raise BundleError(ErrorCode.NOT_FP32_MODEL, "--precisions needs an FP32 .onnx model to make the variants from")
    if "int8" in options.precisions and not options.calibration:
        raise BundleError(
            ErrorCode.CALIBRATION_REQUIRED,
            "the int8 variant needs calibration images: --calibration DIR with .jpg/.png frames like the camera's",
        )
    if set(options.precisions) - {"fp32"} and not options.proof_images:
        raise BundleError(
            ErrorCode.VALIDATION_REQUIRED,
            "variants are proven against FP32 before they ship: give --validation DIR (or --calibration DIR)",
        )


def _read_images(paths: Sequence[Path], code: ErrorCode, role: str) -> list[npt.NDArray[Any]]:
    import cv2

    images = []
    for path in paths:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is None:
            raise BundleError(code, f"{role} image {path} cannot be read as an image")
        images.append(image)
    return images


def _variant_name(source: Path, precision: Precision) -> str:
    stem = source.stem.removesuffix("_fp32")
    return f"{stem}_{precision}.onnx"


def _size_note(path: Path, baseline: Path) -> str:
    size, base = sum(p.stat().st_size for p in model_files(path)), baseline.stat().st_size
    return f"{size} bytes, {base / size:.1f}x smaller than FP32"


def _verdict(name: str, measured: Measured, options: Options) -> tuple[bool, str]:
    """Whether the variant ships, and the line that says so."""
    agreement = measured.agreement
    where = f"{measured.images} validation image{'s' if measured.images != 1 else ''}"
    if agreement is None:
        return False, (
            f"{name}: left out: the FP32 model found nothing on the {where}, so agreement cannot be measured "
            "(use images that show the objects)"
        )
    counts = f"{measured.matched} of {measured.baseline_detections} FP32 detections matched on {where}"
    if agreement < options.min_agreement:
        gap = options.min_agreement - agreement
        return False, (
            f"{name}: left out: detection agreement {agreement:.3f} is {gap:.3f} below "
            f"--min-agreement {options.min_agreement:.2f} ({counts})"
        )
    return True, (
        f"{name}: kept: detection agreement {agreement:.3f} ({counts}, {measured.extra} extra), "
        f"max |output error| {measured.max_abs_error:.3g}"
    )


def _make(
    source: Path,
    precision: Precision,
    target: Path,
    calibration: Sequence[npt.NDArray[Any]],
    input_name: str,
    options: Options,
    op_types: Sequence[str] = (),
) -> None:
    """Write the `precision` variant of the FP32 model `source` to `target` (INT8: calibrated as
    `options` say on the preprocessed `calibration` tensors, fed to the input `input_name`, only
    the `op_types` given quantized, else all)."""
    import onnx

    if precision == "fp16":
        onnx.save(to_fp16(onnx.load(str(source))), str(target))
    else:
        quantize_qdq(source, target, input_name, calibration, options.method, options.activations, op_types)


@dataclass(frozen=True)
class _Attempt:
    """Making one variant of the FP32 model `source` at `target` and proving it against `baseline`
    on the validation `images`; INT8 calibrated on the preprocessed `calibration` tensors, fed to
    the input `input_name`."""

    source: Path
    target: Path
    calibration: Sequence[npt.NDArray[Any]]
    input_name: str
    baseline: Detector
    images: Sequence[npt.NDArray[Any]]
    options: Options

    def run(self, precision: Precision, name: str, op_types: Sequence[str] = ()) -> tuple[Measured | None, str, bool]:
        """Make the variant (INT8: only `op_types` quantized when given) and prove it on ONNX
        Runtime: its measurement when it ships, the line that says so (`name` first), and whether
        the gate refused it on its agreement (rather than it failing to be made, load or be measured)."""

        def make() -> None:
            _make(self.source, precision, self.target, self.calibration, self.input_name, self.options, op_types)

        return self._prove(name, make, "onnxruntime")

    def run_openvino(self, name: str) -> tuple[Measured | None, str, bool]:
        """`run` for the INT8 variant the OpenVINO way: NNCF writes an IR at `target` (a ``.xml``),
        proven on OpenVINO."""
        from agent.optimise.nncf_int8 import quantize_openvino

        return self._prove(name, lambda: quantize_openvino(self.source, self.target, self.calibration), "openvino")

    def _prove(self, name: str, make: Callable[[], object], runtime_name: str) -> tuple[Measured | None, str, bool]:
        try:
            make()
        except Exception as exc:  # the converters raise anything from KeyError to onnxruntime's Fail
            return None, f"{name}: left out: it could not be made ({type(exc).__name__}: {exc})", False
        try:
            with load_runtime(runtime_name, self.target) as runtime:
                measured = measure(self.baseline, Detector(runtime, self.baseline.decoder), self.images)
        except (BackendError, DecoderError, ValueError) as exc:
            return None, f"{name}: left out: {exc}", False
        ok, verdict = _verdict(name, measured, self.options)
        return (measured, verdict, False) if ok else (None, verdict, measured.agreement is not None)


def _variants(source: Path, options: Options, workdir: Path, say: Say) -> Prepared:
    """The FP32 model at `source` and its variants, each proven against it; only those that pass."""
    kept: list[Path] = []
    notes: dict[str, ArtifactNotes] = {}
    verdicts: list[str] = []
    images = _read_images(options.proof_images, ErrorCode.VALIDATION_REQUIRED, "validation")

    def settle(target: Path, precision: Precision, measured: Measured | None, verdict: str) -> None:
        """Keep a variant that passed (its size said), and say the verdict either way."""
        if measured is not None:
            verdict += f", {_size_note(target, source)}"
            kept.append(target)
            notes[target.name] = ArtifactNotes(precision, measured.to_manifest(source.name, options.min_agreement))
        verdicts.append(verdict)
        say(verdict)

    with load_runtime("onnxruntime", source) as runtime:
        baseline = Detector(runtime, options.decoder)
        calibration = [
            baseline.prepare(image)[0]
            for image in _read_images(options.calibration, ErrorCode.CALIBRATION_REQUIRED, "calibration")
        ]
        for precision in dict.fromkeys(options.precisions):
            if precision == "fp32":
                kept.append(source)
                notes[source.name] = ArtifactNotes(precision="fp32")
                say(f"{source.name} (fp32): kept: the baseline, {source.stat().st_size} bytes")
                continue
            target = workdir / _variant_name(source, precision)
            attempt = _Attempt(source, target, calibration, runtime.inputs[0].name, baseline, images, options)
            measured, verdict, refused = attempt.run(precision, f"{target.name} ({precision})")
            if refused and precision == "int8":
                # Quantized whole, a model whose one output holds pixel coordinates beside 0..1
                # scores (mask coefficients, keypoints, an angle) can lose everything under one
                # INT8 scale: the network alone, the head's decode left in float.
                verdicts.append(verdict)
                say(verdict)
                measured, verdict, refused = attempt.run(precision, f"{target.name} (int8, head in float)", COMPUTE_OPS)
                if refused:
                    verdict += _INT8_HINT
            settle(target, precision, measured, verdict)
        if options.openvino_int8:
            target = workdir / f"{source.stem.removesuffix('_fp32')}_int8_openvino.xml"
            attempt = _Attempt(source, target, calibration, runtime.inputs[0].name, baseline, images, options)
            measured, verdict, _ = attempt.run_openvino(f"{target.name} (int8, NNCF, OpenVINO IR)")
            settle(target, "int8", measured, verdict)
    if not kept:
        raise BundleError(ErrorCode.NO_ARTIFACT_KEPT, "no variant kept its accuracy: " + "; ".join(verdicts))
    return Prepared(tuple(kept), notes)


def prepare(models: Sequence[Path], options: Options, workdir: Path, say: Say) -> Prepared:
    """The artifacts to bundle for `models` (see the module's docstring). Raises `BundleError`:
    ``MODEL_CHECK_FAILED``, ``NOT_FP32_MODEL``, ``CALIBRATION_REQUIRED``, ``VALIDATION_REQUIRED``,
    ``NO_ARTIFACT_KEPT``, ``DECODER_MISMATCH``."""
    check_options(models, options)
    frame = reference_frame(options.calibration)
    source = next((path for path in models if path.suffix == ".onnx"), None) if options.precisions else None
    shipped: list[Path] = []
    notes: dict[str, ArtifactNotes] = {}
    for path in models:
        if path.suffix != ".onnx":
            shipped.append(path)
            continue
        model = check_model(path)
        facts = describe(model)
        say(f"{path.name}: {facts.summary()}")
        for warning in facts.warnings:
            say(f"  warning: {warning}")
        if path == source and facts.precision != "fp32":
            raise BundleError(
                ErrorCode.NOT_FP32_MODEL,
                f"{path.name} is {facts.precision}: --precisions makes variants from an FP32 model",
            )
        hygienic = path
        if options.simplify:
            try:
                with load_runtime("onnxruntime", path, warmup=False) as runtime:
                    tensor = Detector(runtime, options.decoder).prepare(frame)[0]
            except DecoderError as exc:
                raise BundleError(ErrorCode.DECODER_MISMATCH, f"{path.name}: {exc}") from exc
            result = simplify(model, path, workdir / path.name, tensor)
            say(f"  {result.note}")
            hygienic = result.path
        if path == source:
            variants = _variants(hygienic, options, workdir, say)
            shipped.extend(variants.models)
            notes.update(variants.notes)
        else:
            shipped.append(hygienic)
            notes[hygienic.name] = ArtifactNotes(precision=facts.precision)
    return Prepared(tuple(shipped), notes)
