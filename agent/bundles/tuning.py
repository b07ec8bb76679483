"""The optimisation matrix of a bundle on this device, and autotune at activation.

`candidates` lists every way this device could run the bundle's artifacts (`pipelines.measure.matrix.
Candidate`), as each backend of the registry that loads the artifact's format says
(`runtimes.registry.tune_candidates`, `Backend.candidates`): with the in-tree backends, TensorRT
FP32 / FP16 / INT8 per ONNX artifact (an explicitly quantized one: INT8 only), ONNX Runtime per
installed execution provider, OpenVINO per device it lists (the ``openvino`` extra), LiteRT per
delegate; with `variants`, ONNX Runtime and OpenVINO on the CPU also with several calls in
flight (`runtimes.base.worker_variants`; OpenVINO's THROUGHPUT hint); a plugin's as it declares them, or its
settings as they are. Those that cannot run here carry the reason. `with_prepared` makes each
ready to measure (`Backend.prepare`: TensorRT's engines). `reference_of` builds what rows are
compared with from the bundle's reference.npz. `autotune` measures the candidates that can run
now (in this process, briefly; a backend `measured_apart` wholly in a child) and picks the
fastest within the manifest's parity tolerance and `max_latency_ms`: a `Tuning`, kept in the
deployment record (`tuning_record`) and by the store, that the cameras serve
(agent.serving.loader). `Tuning` itself lives in agent/bundles/record.py (re-exported here), so
reading a record never imports the measuring code. No backend is named here: what differs
between backends is in their registry entries (``tests/house/test_backends.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy.typing as npt

from agent.bundles.archive import REFERENCE_RUNTIMES, reference_frame
from agent.bundles.engine_settings import bundle_model, calibration_images, version_settings
from agent.bundles.manifest import ArtifactEntry, Manifest
from agent.bundles.record import ReportRow, TuningRecord
from agent.bundles.record import Tuning as Tuning  # re-exported: autotune's result
from agent.hardware.board import Board
from pipelines.decoding.detector import Detector
from pipelines.measure.matrix import (
    Candidate,
    EnergyMeter,
    Reference,
    Row,
    choose,
    measure,
    measure_isolated,
    no_energy_meter,
)
from runtimes.base import BackendError, Progress, TuneCandidate, dequantize
from runtimes.registry import (
    BACKENDS,
    RuntimeSettings,
    available_runtimes,
    check_load,
    load_runtime,
    prepare,
    tune_candidates,
)
from runtimes.selection import Artifact, runtimes_for

log = logging.getLogger(__name__)


def _candidate(runtime: str, artifact: ArtifactEntry, path: Path, tried: TuneCandidate, root: str) -> Candidate:
    c = tried
    return Candidate(
        runtime, c.device, artifact.path, str(path), c.precision, c.workers, c.threads, c.config, c.unavailable, root
    )


def candidates(
    folder: Path, manifest: Manifest, board: Board, settings: RuntimeSettings, variants: bool = False
) -> list[Candidate]:
    """Every runtime x artifact x precision / provider / delegate for this bundle here (see the
    module docstring), artifact by artifact, backends in the registry's order; `board` is where
    it runs (the report names it)."""
    settings = version_settings(settings, manifest)
    artifacts = [Artifact(str(folder / a.path), a.format, a.precision) for a in manifest.artifacts]
    available = available_runtimes(runtimes_for(artifacts), root=Path(board.root))  # its devices, as activation's
    found: list[Candidate] = []
    for artifact in manifest.artifacts:
        model = bundle_model(folder, manifest, artifact)
        for name, info in available.items():
            if artifact.format not in BACKENDS[name].formats:
                continue
            for tried in tune_candidates(name, settings.config_for(name), model, info, variants):
                found.append(_candidate(name, artifact, model.path, tried, board.root))
    log.debug("matrix for %s on %s: %d candidates", manifest.name, board.model, len(found))
    return found


def reference_artifact(manifest: Manifest) -> ArtifactEntry:
    """What detections are compared with: the first FP32 artifact (ONNX first), else the first."""
    fp32 = sorted((a for a in manifest.artifacts if a.precision == "fp32"), key=lambda a: a.format != "onnx")
    return fp32[0] if fp32 else manifest.artifacts[0]


def reference_of(folder: Path, manifest: Manifest, arrays: Mapping[str, npt.NDArray[Any]]) -> Reference:
    """The reference rows are compared with (`pipelines.measure.matrix.Reference`): per artifact its
    reference input and outputs; the reference artifact's detections, decoded on the CPU."""
    inputs = {a.path: arrays[f"{a.path}__input"] for a in manifest.artifacts}
    outputs = {
        a.path: [arrays[k] for i in range(64) if (k := f"{a.path}__output{i}") in arrays] for a in manifest.artifacts
    }
    frame = reference_frame(calibration_images(folder, manifest))
    chosen = reference_artifact(manifest)
    thresholds = manifest.thresholds
    detections = None
    try:
        runtime = load_runtime(REFERENCE_RUNTIMES[chosen.format], folder / chosen.path, warmup=False)
        with runtime:
            detector = Detector(runtime, manifest.decoder, thresholds.conf, thresholds.iou, thresholds.max_det)
            _, transform = detector.prepare(frame)
            raw = [dequantize(o, s) for o, s in zip(outputs[chosen.path], runtime.outputs, strict=True)]
            detections = detector.postprocess(raw, transform)
    except BackendError as exc:
        log.warning("no reference detections (%s cannot run on the CPU here: %s)", chosen.path, exc)
    ref = manifest.reference
    return Reference(
        inputs, outputs, frame, detections, chosen.path, manifest.decoder,
        thresholds.conf, thresholds.iou, thresholds.max_det, ref.atol, ref.rtol,
    )  # fmt: skip


def with_prepared(
    found: list[Candidate],
    folder: Path,
    manifest: Manifest,
    on_progress: Callable[[str, Progress], None] = lambda name, progress: None,
) -> list[Candidate]:
    """Make every candidate that can run here ready to be measured, as its backend needs
    (`runtimes.registry.prepare`: TensorRT builds its engine, or finds it cached); one whose
    preparation fails says why in its row instead. `on_progress` hears ("<artifact> <precision>",
    progress) of each."""
    ready = []
    for candidate in found:
        entry = BACKENDS.get(candidate.runtime)
        if entry is not None and entry.prepare is not None and candidate.unavailable is None and candidate.config:
            artifact = next(a for a in manifest.artifacts if a.path == candidate.artifact)
            label = f"{candidate.artifact} {candidate.precision}"

            def progress(step: Progress, label: str = label) -> None:
                on_progress(label, step)

            try:
                prepare(candidate.runtime, candidate.config, bundle_model(folder, manifest, artifact), progress)
            except BackendError as exc:
                candidate = replace(candidate, unavailable=str(exc))
        ready.append(candidate)
    return ready


def run_matrix(
    found: Sequence[Candidate],
    reference: Reference,
    frames: int,
    energy: Callable[[], EnergyMeter | None] = no_energy_meter,
    on_row: Callable[[Row], None] = lambda row: None,
) -> list[Row]:
    """Measure each candidate in its own process (`measure_isolated`), in order."""
    rows = []
    for candidate in found:
        row = measure_isolated(candidate, reference, frames, energy)
        on_row(row)
        rows.append(row)
    return rows


def tuning_record(choice: Tuning | None, rows: Sequence[Row]) -> TuningRecord:
    """What the deployment record keeps of an autotune: the choice and every measured row."""
    return TuningRecord(choice, tuple(ReportRow(**asdict(row)) for row in rows))


def _apart(runtime: str) -> bool:
    """Whether autotune measures `runtime`'s rows wholly in a child process (`Backend.measured_apart`:
    loading its library here would keep its memory after the row, in a process that may serve another)."""
    entry = BACKENDS.get(runtime)
    return entry is not None and entry.measured_apart


def measure_for_autotune(candidate: Candidate, reference: Reference, frames: int) -> Row:
    """A row as autotune measures it: in this process, after a check process loaded it without
    dying; or, for a backend `measured_apart`, wholly in a child (`measure_isolated`)."""
    if _apart(candidate.runtime):
        return measure_isolated(candidate, reference, frames)
    return measure(candidate, reference, frames)


def autotune(
    folder: Path,
    manifest: Manifest,
    arrays: Mapping[str, npt.NDArray[Any]],
    board: Board,
    settings: RuntimeSettings,
    frames: int = 30,
    max_latency_ms: float | None = None,
    measure_row: Callable[[Candidate, Reference, int], Row] = measure_for_autotune,
) -> tuple[Tuning | None, list[Row]]:
    """Measure what can run now (briefly, in this process, each configuration's first load checked
    in a child process first, `runtimes.isolation`) and choose; (None, rows) when nothing
    qualifies. Candidates are not prepared here (`with_prepared`): TensorRT rows whose engine
    is not built yet say so and are not chosen; the engine, once built and past the parity
    check, is served anyway (agent.serving.cameras).
    `measure_row` measures one candidate (`measure_for_autotune`; a test injects its own figures)."""
    reference = reference_of(folder, manifest, arrays)
    rows = []
    for candidate in candidates(folder, manifest, board, settings, variants=True):
        try:
            # a row measured wholly in a child needs no check process first
            apart = measure_row is measure_for_autotune and _apart(candidate.runtime)
            if candidate.unavailable is None and not apart:  # a crash kills a check process, not the agent
                config = candidate.config or settings.config_for(candidate.runtime)
                check_load(candidate.runtime, Path(candidate.path), config)
            rows.append(measure_row(candidate, reference, frames))
        except Exception as exc:  # one configuration failing never fails the activation
            rows.append(Row.failed(candidate, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
    best, why = choose(rows, manifest.reference.min_fraction, max_latency_ms)
    if best is None:
        log.warning("autotune for %s %s: %s", manifest.name, manifest.version, why)
        return None, rows
    latency = best.latency_ms or {}
    tuning = Tuning(
        best.runtime, best.provider, best.artifact, best.precision, best.threads, best.workers,
        best.fps, latency.get("p95"), why,
    )  # fmt: skip
    log.info("autotune for %s %s: %s", manifest.name, manifest.version, tuning)
    return tuning, rows
