"""Loading a model to serve: an installed version (`open_detector`, for the cameras) or a bare
model file (`load_model`, for ``edge-agent detect`` and ``bench``), on the best runtime of this
board that loads it (`runtimes.selection`), falling back to the next when one fails."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from agent.bundles.archive import read_manifest
from agent.bundles.install import runtime_choices
from agent.bundles.manifest import Manifest
from agent.errors import BundleError, ErrorCode
from agent.hardware.probe import Board, probe
from pipelines.detector import Detector
from runtimes.base import ModelLoadError, Runtime, RuntimeUnavailable
from runtimes.isolation import RuntimeCrashed
from runtimes.registry import RuntimeSettings, available_runtimes, load_runtime, load_runtime_checked
from runtimes.selection import Artifact, Choice, Preference, runtimes_for, select_runtimes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    """An installed version loaded for serving: the detector, its manifest, and the runtime
    choice that loaded it (runtime, artifact, device and why)."""

    detector: Detector
    manifest: Manifest
    choice: Choice


def open_detector(
    folder: Path,
    board: Board,
    preference: Preference = "auto",
    workers: int = 1,
    settings: RuntimeSettings | None = None,
    lighter: bool = False,
) -> Loaded:
    """Load an installed version for serving: the best runtime that loads it, with the decoder
    and thresholds of its manifest, set up for `workers` calls at once where the runtime allows
    several. `lighter` (the governor's choice when the board runs hot or low) puts the
    version's lightest artifacts first (int8, then fp16, then fp32), whatever the runtime. A
    runtime whose first load of the artifact killed a check process is skipped (the version
    keeps serving on the next one). Raises `BundleError` (``NO_RUNTIME``) when none loads."""
    settings = settings or RuntimeSettings()
    _, manifest = read_manifest(folder)
    failures = []
    choices = runtime_choices(folder, manifest, board, preference)
    if lighter:
        choices = lightest_first(choices)
    for choice in choices:
        try:
            runtime = load_runtime_checked(
                choice.runtime, Path(choice.artifact.path), settings.config_for(choice.runtime), workers=workers
            )
        except (RuntimeUnavailable, ModelLoadError, RuntimeCrashed) as exc:
            failures.append(f"{choice.runtime}: {exc}")
            continue
        thresholds = manifest.thresholds
        detector = Detector(runtime, manifest.decoder, thresholds.conf, thresholds.iou, thresholds.max_det)
        log.info("serving %s %s on %s (%s)", manifest.name, manifest.version, choice.runtime, choice.reason)
        return Loaded(detector, manifest, choice)
    raise BundleError(ErrorCode.NO_RUNTIME, f"no runtime could load {folder}: " + "; ".join(failures))


_LIGHTNESS = {"int8": 0, "fp16": 1, "fp32": 2}


def lightest_first(choices: list[Choice]) -> list[Choice]:
    """`choices` with the lightest precision first, in the policy's order otherwise."""
    ranked = sorted(choices, key=lambda c: _LIGHTNESS.get(c.artifact.precision, 3))
    if ranked and ranked[0] != choices[0]:
        first = ranked[0]
        why = f"{first.reason}; the lighter {first.artifact.precision} artifact, for the governor"
        ranked[0] = Choice(first.runtime, first.artifact, first.device, why)
    return ranked


def load_model(
    model: Path, preference: Preference = "auto", warmup: bool = True, workers: int = 1
) -> tuple[Runtime, Choice]:
    """Rank runtimes for `model` on this board and load the first that works. With `workers`
    calls in flight at once, ONNX Runtime gives each call an equal share of the cores. Raises
    `RuntimeUnavailable` naming why each runtime failed."""
    artifacts = [Artifact.from_path(model)]
    # one-shot commands import and load here: a probe child would import each library twice
    # and cost `detect` its start-up goal (docs/arm64.md); `edge-agent probe` isolates
    available = available_runtimes(runtimes_for(artifacts), isolated=False)
    failures = []
    for choice in select_runtimes(probe(), available, artifacts, preference):
        try:
            runtime = load_runtime(choice.runtime, model, warmup=warmup, workers=workers)
        except RuntimeUnavailable as exc:
            failures.append(f"{choice.runtime}: {exc}")
            log.warning("runtime %s unavailable, trying the next: %s", choice.runtime, exc)
            continue
        log.info("runtime %s on %s: %s", choice.runtime, choice.device, choice.reason)
        return runtime, choice
    raise RuntimeUnavailable("no runtime could load the model: " + "; ".join(failures))
