"""Loading a model to serve: an installed version (`open_detector`, for the cameras; its second
stage's classifier, `open_classifier`) or a bare
model file (`load_model`, for ``edge-agent detect`` and ``bench``), on the best runtime of this
board that loads it (`runtimes.selection`), falling back to the next when one fails. What a
backend is (its settings, how autotune's choice applies to them) comes from its registry entry
(`runtimes.registry.BACKENDS`); only TensorRT's engines, built on the device, are handled by name."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import BundleError, ErrorCode
from agent.hardware.board import Board, probe
from pipelines.decoding.classifier import Classifier
from pipelines.decoding.decoders import DecoderError, artifact_decoder
from pipelines.decoding.detector import Detector
from runtimes.base import ModelLoadError, Runtime, RuntimeInfo, RuntimeUnavailable
from runtimes.registry import BACKENDS, RuntimeSettings, available_runtimes, load_runtime, load_runtime_checked
from runtimes.selection import Artifact, Choice, Preference, runtime_order, runtimes_for, select_runtimes
from runtimes.tensorrt_settings import EngineNotReady

if TYPE_CHECKING:
    from agent.bundles.manifest import ClassifierStage, Manifest
    from agent.bundles.record import Tuning
    from runtimes.tensorrt_backend import TensorRTBackend

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    """An installed version loaded for serving: the detector, its manifest, and the runtime
    choice that loaded it (runtime, artifact, device and why). `pending` is set when a better
    runtime, TensorRT, was passed over only because its engine is not built yet (or its last
    build failed: `pending.failure`), with the artifact it would serve."""

    detector: Detector
    manifest: Manifest
    choice: Choice
    pending: EngineNotReady | None = None
    pending_artifact: Path | None = None


def _tuned(
    choices: list[Choice], settings: RuntimeSettings, tuning: Tuning, folder: Path, manifest: Manifest, workers: int
) -> tuple[list[Choice], RuntimeSettings]:
    """Autotune's choice first (after the policy's first choice when autotune does not choose
    that backend, `Backend.tune` None: a TensorRT engine, once built, beats every CPU
    configuration), with its provider or delegate and, when the camera runs as many workers as
    were tuned, its threads per call (the backend's `tune` applies them to its settings)."""
    entry = next((a for a in manifest.artifacts if a.path == tuning.artifact), None)
    backend = BACKENDS.get(tuning.runtime)
    if entry is None or backend is None or backend.tune is None:
        return choices, settings
    artifact = Artifact(str(folder / entry.path), entry.format, entry.precision)
    tuned = Choice(tuning.runtime, artifact, tuning.provider, f"autotune: {tuning.reason}")
    rest = [c for c in choices if (c.runtime, c.artifact.path) != (tuned.runtime, artifact.path)]
    first = 1 if rest and _untuned(rest[0].runtime) else 0
    threads = tuning.threads if workers == tuning.workers else None
    settings = settings.replace(backend.tune(settings.config_for(tuning.runtime), tuning.provider, threads))
    return [*rest[:first], tuned, *rest[first:]], settings


def _untuned(runtime: str) -> bool:
    """Whether autotune never chooses `runtime` (TensorRT: its engine is built after activation)."""
    backend = BACKENDS.get(runtime)
    return backend is None or backend.tune is None


def open_detector(
    folder: Path,
    board: Board,
    preference: Preference = "auto",
    workers: int = 1,
    settings: RuntimeSettings | None = None,
    tuning: Tuning | None = None,
    lighter: bool = False,
) -> Loaded:
    """Load an installed version for serving: the best runtime that loads it (autotune's choice
    when `tuning` is given and the configuration leaves the runtime to auto), with the decoder
    and thresholds of its manifest, set up for `workers` calls at once where the runtime allows
    several. `lighter` (the governor's choice when the board runs hot or low) puts the
    version's lightest artifacts first (int8, then fp16, then fp32), whatever the runtime or
    the tuning. A runtime whose first load of the artifact killed a check process is skipped
    (the version keeps serving on the next one), and so is a TensorRT engine whose detections
    fail the plausibility guard (recorded as failed, `pending.failure`). Raises `BundleError`
    (``NO_RUNTIME``) when none loads, `DecoderError` when the decoder does not fit."""
    from agent.bundles.archive import read_manifest  # bundles' code (signatures, archives): versions only,
    from agent.bundles.engine_settings import version_settings  # not `load_model`'s (detect's start-up)
    from agent.bundles.installer import runtime_choices
    from runtimes.isolation import RuntimeCrashed  # the check processes: versions only, too
    from runtimes.tensorrt_backend import TensorRTBackend

    _, manifest = read_manifest(folder)
    settings = version_settings(settings or RuntimeSettings(), manifest)
    failures = []
    pending: tuple[EngineNotReady, Path] | None = None
    choices = runtime_choices(folder, manifest, board, preference)
    if tuning is not None and preference == "auto":
        choices, settings = _tuned(choices, settings, tuning, folder, manifest, workers)
    if lighter:
        choices = lightest_first(choices)
    for choice in choices:
        try:
            runtime = load_runtime_checked(
                choice.runtime,
                Path(choice.artifact.path),
                settings.config_for(choice.runtime),
                workers=workers,
                root=Path(board.root),  # its device where activation found it
            )
        except EngineNotReady as exc:
            pending = pending or (exc, Path(choice.artifact.path))
            failures.append(f"{choice.runtime}: {exc}")
            continue
        except (RuntimeUnavailable, ModelLoadError, RuntimeCrashed) as exc:
            failures.append(f"{choice.runtime}: {exc}")
            continue
        thresholds = manifest.thresholds
        try:
            decoder = artifact_decoder(manifest.decoder, runtime.metadata.end2end)  # a HEF's NMS on the chip
            detector = Detector(runtime, decoder, thresholds.conf, thresholds.iou, thresholds.max_det)
        except DecoderError as exc:
            runtime.close()
            if not isinstance(runtime, TensorRTBackend):
                raise
            pending = _implausible_engine(runtime, exc), Path(choice.artifact.path)
            failures.append(f"{choice.runtime}: {pending[0]}")
            continue
        log.info("serving %s %s on %s (%s)", manifest.name, manifest.version, choice.runtime, choice.reason)
        if pending is None:
            return Loaded(detector, manifest, choice)
        return Loaded(detector, manifest, choice, pending[0], pending[1])
    raise BundleError(ErrorCode.NO_RUNTIME, f"no runtime could load {folder}: " + "; ".join(failures))


def _implausible_engine(runtime: TensorRTBackend, exc: DecoderError) -> EngineNotReady:
    """A TensorRT engine whose detections the plausibility guard refuses (built wrong, e.g. an
    FP16 overflow) is never served: recorded as failed (so it is not rebuilt either) and discarded."""
    message = f"the TensorRT engine fails the plausibility guard: {exc}"
    log.error("%s; the next runtime serves instead", message)
    return runtime.reject(message)


_LIGHTNESS = {"int8": 0, "fp16": 1, "fp32": 2}


def lightest_first(choices: list[Choice]) -> list[Choice]:
    """`choices` with the lightest precision first, in the policy's order otherwise."""
    ranked = sorted(choices, key=lambda c: _LIGHTNESS.get(c.artifact.precision, 3))
    if ranked and ranked[0] != choices[0]:
        first = ranked[0]
        why = f"{first.reason}; the lighter {first.artifact.precision} artifact, for the governor"
        ranked[0] = Choice(first.runtime, first.artifact, first.device, why)
    return ranked


@dataclass(frozen=True)
class LoadedClassifier:
    """A version's second stage loaded for serving: the classifier, its section of the manifest
    (labels, the detector labels it applies to, `every_s`) and the runtime choice that loaded it."""

    classifier: Classifier
    stage: ClassifierStage
    choice: Choice

    def close(self) -> None:
        self.classifier.runtime.close()


def open_classifier(
    folder: Path,
    board: Board,
    preference: Preference = "auto",
    settings: RuntimeSettings | None = None,
    lighter: bool = False,
) -> LoadedClassifier | None:
    """An installed version's second stage, loaded on the best runtime here that loads it (with
    `lighter`, the governor's choice, its lightest artifact first, as for the detector); None when
    the version has no classifier. Raises `BundleError` ``NO_RUNTIME`` when none loads,
    ``CLASSIFIER_MISMATCH`` when the model is not a classifier of the manifest's labels."""
    from agent.bundles.archive import read_manifest  # bundles' code (signatures, archives): versions only,
    from agent.bundles.engine_settings import version_settings  # not `load_model`'s (detect's start-up)
    from agent.bundles.installer import runtime_choices
    from runtimes.isolation import RuntimeCrashed

    _, manifest = read_manifest(folder)
    stage = manifest.classifier
    if stage is None:
        return None
    settings = version_settings(settings or RuntimeSettings(), manifest)
    choices = runtime_choices(folder, manifest, board, preference, stage.artifacts)
    if lighter:
        choices = lightest_first(choices)
    failures = []
    for choice in choices:
        path = Path(choice.artifact.path)
        try:
            runtime = load_runtime_checked(
                choice.runtime, path, settings.config_for(choice.runtime), root=Path(board.root)
            )
        except (RuntimeUnavailable, ModelLoadError, RuntimeCrashed) as exc:
            failures.append(f"{choice.runtime}: {exc}")
            continue
        try:
            classifier = Classifier(runtime)
        except DecoderError as exc:
            runtime.close()
            raise BundleError(ErrorCode.CLASSIFIER_MISMATCH, f"classifier {path.name}: {exc}") from exc
        if classifier.num_classes != len(stage.labels):
            runtime.close()
            raise BundleError(
                ErrorCode.CLASSIFIER_MISMATCH,
                f"classifier {path.name} gives {classifier.num_classes} scores for {len(stage.labels)} labels",
            )
        log.info("second stage: classifier %s on %s (%s)", path.name, choice.runtime, choice.reason)
        return LoadedClassifier(classifier, stage, choice)
    raise BundleError(ErrorCode.NO_RUNTIME, f"no runtime could load the classifier of {folder}: " + "; ".join(failures))


def load_model(
    model: Path, preference: Preference = "auto", warmup: bool = True, workers: int = 1
) -> tuple[Runtime, Choice]:
    """Rank runtimes for `model` on this board and load the first that works. With `workers`
    calls in flight at once, ONNX Runtime gives each call an equal share of the cores. Raises
    `RuntimeUnavailable` naming why each runtime failed (`SelectionError` when none is installed).

    Runtimes are probed one at a time in the policy's order, in this process, and only until one
    loads: a one-shot command imports the library it runs and those ranked before it, never the
    others (OpenVINO's import alone is 0.46 s and 33 MB: `detect`'s start-up goal, docs/arm64.md)."""
    artifacts = [Artifact.from_path(model)]
    board = probe()
    loadable = set(runtimes_for(artifacts))
    available: dict[str, RuntimeInfo] = {}
    failures = []
    for name in (n for n in runtime_order(board, preference) if n in loadable):
        # one-shot commands import and load here: a probe child would import each library twice
        available |= available_runtimes([name], isolated=False)
        if not available[name].available:
            continue
        choice = next(c for c in select_runtimes(board, available, artifacts, preference) if c.runtime == name)
        try:
            runtime = load_runtime(choice.runtime, model, warmup=warmup, workers=workers)
        except RuntimeUnavailable as exc:
            failures.append(f"{choice.runtime}: {exc}")
            log.warning("runtime %s unavailable, trying the next: %s", choice.runtime, exc)
            continue
        log.info("runtime %s on %s: %s", choice.runtime, choice.device, choice.reason)
        return runtime, choice
    if not failures:
        select_runtimes(board, available, artifacts, preference)  # raises SelectionError with every reason
    raise RuntimeUnavailable("no runtime could load the model: " + "; ".join(failures))
