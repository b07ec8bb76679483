"""The optimisation matrix of a bundle on this device, and autotune at activation.

`candidates` lists every way this device could run the bundle's artifacts (`pipelines.measure.matrix.
Candidate`): TensorRT FP32 / FP16 / INT8 per ONNX artifact (an explicitly quantized one: INT8
only), ONNX Runtime per installed execution provider, OpenVINO per device it lists (the
``openvino`` extra), LiteRT per delegate; with `variants`, ONNX Runtime and OpenVINO on the CPU
also with several calls in flight (`worker_variants`; OpenVINO's THROUGHPUT hint). Those that cannot run
here carry the reason. `reference_of` builds what rows are compared with from the bundle's
reference.npz. `autotune` measures the candidates that can run now (in this process, briefly)
and picks the fastest within the manifest's parity tolerance and `max_latency_ms`: a `Tuning`,
kept in the deployment record (`tuning_record`) and by the store, that the cameras serve
(agent.serving.loader). `Tuning` itself lives in agent/bundles/record.py (re-exported here), so
reading a record never imports the measuring code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy.typing as npt

from agent.bundles.archive import REFERENCE_RUNTIMES, reference_frame
from agent.bundles.engine_settings import bundle_calibration, calibration_images, prebuilt_engines, tensorrt_config
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
from runtimes.base import BackendError, Precision, RuntimeInfo, dequantize, usable_cores
from runtimes.litert_backend import LiteRTConfig
from runtimes.openvino_backend import DEVICES as OPENVINO_DEVICES
from runtimes.openvino_backend import OpenVINOConfig
from runtimes.ort_backend import PROVIDERS, OnnxRuntimeConfig
from runtimes.registry import RuntimeSettings, available_runtimes, check_load, load_runtime
from runtimes.selection import Artifact, runtimes_for
from runtimes.tensorrt_backend import TensorRTConfig, engine_precision
from runtimes.tensorrt_build import BuildProgress
from runtimes.tensorrt_engines import prepare_engine

log = logging.getLogger(__name__)

_PRECISIONS: tuple[Precision, ...] = ("fp32", "fp16", "int8")


def worker_variants(cores: int) -> list[tuple[int, int]]:
    """(calls in flight, threads per call) worth trying on `cores` cores: one call using every
    core, and two calls of half the cores each (often faster: one call keeps only part of the
    cores busy, docs/benchmarks.md)."""
    variants = [(1, cores)]
    if cores >= 2:
        variants.append((2, cores // 2))
    return variants


def _ort_candidates(
    artifact: ArtifactEntry, path: str, info: RuntimeInfo, settings: RuntimeSettings, variants: bool
) -> list[Candidate]:
    found = []
    config = settings.of(OnnxRuntimeConfig)
    for key in dict.fromkeys([*config.providers, "cpu"]):
        provider = PROVIDERS[key]
        if provider not in info.devices:
            continue
        shapes = worker_variants(usable_cores()) if variants and key == "cpu" else [(1, None)]
        for workers, threads in shapes:
            tuned = config.model_copy(update={"providers": [key], "intra_op_threads": threads or 0})
            found.append(
                Candidate("onnxruntime", provider, artifact.path, path, artifact.precision, workers, threads, tuned)
            )
    return found


def _openvino_candidates(
    artifact: ArtifactEntry, path: str, info: RuntimeInfo, settings: RuntimeSettings, variants: bool
) -> list[Candidate]:
    """OpenVINO per device it lists (CPU, an Intel GPU or NPU): one call in flight (the LATENCY
    hint), and with `variants` on the CPU also two (THROUGHPUT's streams, ``performance_hint: auto``)."""
    found = []
    config = settings.of(OpenVINOConfig)
    for device in (d for d in OPENVINO_DEVICES if d in info.devices):
        shapes = [1, 2] if variants and device == "CPU" and usable_cores() >= 2 else [1]
        tuned = config.model_copy(update={"device": device})
        for workers in shapes:
            found.append(Candidate("openvino", device, artifact.path, path, artifact.precision, workers, None, tuned))
    return found


def _openvino_rows(
    artifact: ArtifactEntry, path: str, available: Mapping[str, RuntimeInfo], settings: RuntimeSettings, variants: bool
) -> list[Candidate]:
    """OpenVINO's rows of an ONNX or IR artifact, or one row saying why it is unavailable."""
    openvino = available.get("openvino")
    if openvino is None:
        return []
    if not openvino.available:
        return [Candidate("openvino", "CPU", artifact.path, path, artifact.precision, unavailable=openvino.reason)]
    return _openvino_candidates(artifact, path, openvino, settings, variants)


def candidates(
    folder: Path, manifest: Manifest, board: Board, settings: RuntimeSettings, variants: bool = False
) -> list[Candidate]:
    """Every runtime x artifact x precision / provider / delegate for this bundle here (see the
    module docstring); `board` is where it runs (the report names it)."""
    artifacts = [Artifact(str(folder / a.path), a.format, a.precision) for a in manifest.artifacts]
    available = available_runtimes(runtimes_for(artifacts))
    trt = available.get("tensorrt")
    has_calibration = bool(calibration_images(folder, manifest))
    found: list[Candidate] = []
    for artifact in manifest.artifacts:
        path = str(folder / artifact.path)
        if artifact.format == "onnx":
            qdq = engine_precision(Path(path), "fp32") == "int8"
            for precision in ("int8",) if qdq else _PRECISIONS:
                trt_config = tensorrt_config(settings.of(TensorRTConfig), manifest)
                config = trt_config.model_copy(update={"precision": precision})
                why = None if trt and trt.available else (trt.reason if trt else "not probed")
                if why is None and precision == "int8" and not qdq and not has_calibration:
                    why = "int8 needs a Q/DQ model or calibration images in the bundle"
                gpu = trt.devices[0] if trt and trt.devices else "GPU"
                found.append(Candidate("tensorrt", gpu, artifact.path, path, precision, 1, None, config, why))
            ort = available.get("onnxruntime")
            if ort is not None and ort.available:
                found += _ort_candidates(artifact, path, ort, settings, variants)
            elif ort is not None:
                found.append(
                    Candidate("onnxruntime", "CPU", artifact.path, path, artifact.precision, unavailable=ort.reason)
                )
            found += _openvino_rows(artifact, path, available, settings, variants)
        elif artifact.format == "openvino":
            found += _openvino_rows(artifact, path, available, settings, variants)
        else:
            litert = available.get("litert")
            why = None if litert and litert.available else (litert.reason if litert else "not probed")
            litert_config = settings.of(LiteRTConfig)
            xnnpack = litert_config.model_copy(update={"delegate": None})
            delegates: list[tuple[str, LiteRTConfig]] = [("xnnpack", xnnpack)]
            if litert_config.delegate is not None:
                delegates.append((litert_config.delegate.name, litert_config))
            for name, delegate in delegates:
                found.append(Candidate("litert", name, artifact.path, path, artifact.precision, 1, None, delegate, why))
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


def with_engines(
    found: list[Candidate],
    folder: Path,
    manifest: Manifest,
    on_progress: Callable[[str, BuildProgress], None] = lambda name, progress: None,
) -> list[Candidate]:
    """Build (or find cached) the engine of every TensorRT candidate that can run here, so it can
    be measured; a build that fails makes that row say why."""
    ready = []
    for candidate in found:
        if candidate.runtime == "tensorrt" and candidate.unavailable is None and candidate.config is not None:
            assert isinstance(candidate.config, TensorRTConfig)
            sha256 = next(a.sha256 for a in manifest.artifacts if a.path == candidate.artifact)
            label = f"{candidate.artifact} {candidate.precision}"

            def progress(step: BuildProgress, label: str = label) -> None:
                on_progress(label, step)

            try:
                prepare_engine(
                    Path(candidate.path),
                    candidate.config,
                    sha256=sha256,
                    calibration=bundle_calibration(folder, manifest),
                    prebuilt=prebuilt_engines(folder, manifest),
                    on_progress=progress,
                )
            except BackendError as exc:
                candidate = replace(candidate, unavailable=f"engine build failed: {exc}")
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


#: runtimes whose rows autotune measures in a child process of their own: loading the library
#: here would keep its memory after the row (OpenVINO: +105 MB resident for the demo detector,
#: 90 MB of it still held after closing, docs/benchmarks.md), in a process that may serve another
_MEASURED_APART = frozenset({"openvino"})


def measure_for_autotune(candidate: Candidate, reference: Reference, frames: int) -> Row:
    """A row as autotune measures it: in this process, after a check process loaded it without
    dying; or, for a runtime of `_MEASURED_APART`, wholly in a child (`measure_isolated`)."""
    if candidate.runtime in _MEASURED_APART:
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
    qualifies. TensorRT rows whose engine is not built yet say so and are not chosen: the
    engine, once built and past the parity check, is served anyway (agent.serving.cameras).
    `measure_row` measures one candidate (`measure_for_autotune`; a test injects its own figures)."""
    reference = reference_of(folder, manifest, arrays)
    rows = []
    for candidate in candidates(folder, manifest, board, settings, variants=True):
        try:
            # a row measured wholly in a child needs no check process first
            apart = measure_row is measure_for_autotune and candidate.runtime in _MEASURED_APART
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
