"""The optimisation report's measurements: one `Row` per way of running a model (a `Candidate`:
runtime, execution provider or delegate, artifact, precision, threads, workers).

`measure` loads the candidate, checks it against the `Reference` (its artifact's reference
outputs: max abs error and the fraction within the bundle's tolerance; its detections against the
reference artifact's: agreement at IoU >= 0.5 with the same label; an artifact whose runtime gives
final detections, a HEF with NMS on the chip, is read with ``end2end`` as activation reads it,
`artifact_decoder`, and its fraction within tolerance is that agreement), then times inference alone
on the reference input: p50 / p95 latency per call and throughput with `workers` calls at once.
`measure_isolated` does the same in a fresh process (spawned), so peak RSS is the row's own and
a runtime that crashes costs a row, not the caller. A candidate that cannot run yields a row
that says why (`Row.error`), never no row. `choose` is the pure autotune decision.

Energy per frame comes from an `EnergyMeter` (cumulative joules) when the board measures power;
`no_energy_meter` is the default until the sensors provide one.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy.typing as npt

from pipelines.decoding.decoders import artifact_decoder
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.measure.benchmark import peak_rss_mb, time_inference
from pipelines.measure.parity import detection_agreement, max_abs_error, parity_fraction
from runtimes.base import BackendConfig, Precision, RuntimeName, dequantize, first_line
from runtimes.registry import load_runtime

#: cumulative energy drawn by the board in joules, or None when it is not measured
EnergyMeter = Callable[[], float | None]


def no_energy_meter() -> EnergyMeter | None:
    """The energy meter of a board without power sensors: none. (A board's power rails plug in
    here: a picklable function returning a meter, passed as `energy`.)"""
    return None


@dataclass(frozen=True)
class Candidate:
    """One way to run a model: `provider` is the ONNX Runtime execution provider, the LiteRT
    delegate or the TensorRT GPU; `threads` per call (None: the runtime's default); `workers`
    calls in flight at once; `config` the backend settings that make it so. `unavailable` says
    why it cannot run here (its row then carries only that); `root` where the backend finds its
    device (the board's root: ``/`` on a device, a fake tree in tests)."""

    runtime: RuntimeName
    provider: str
    artifact: str
    path: str
    precision: Precision
    workers: int = 1
    threads: int | None = None
    config: BackendConfig | None = None
    unavailable: str | None = None
    root: str = "/"


@dataclass(frozen=True)
class Reference:
    """What rows are compared with: per artifact its reference input and raw outputs (the
    bundle's reference.npz), the frame those inputs were made from, the detections of the
    reference artifact (`reference_artifact`, the bundle's FP32 one when it has one) in that
    frame's pixels, the decoder and thresholds, and the bundle's tolerance."""

    inputs: Mapping[str, npt.NDArray[Any]]
    outputs: Mapping[str, Sequence[npt.NDArray[Any]]]
    frame: npt.NDArray[Any]
    detections: Detections | None
    reference_artifact: str
    decoder: str = "auto"
    conf: float = 0.25
    iou: float = 0.45
    max_det: int = 300
    atol: float = 0.02
    rtol: float = 0.05


@dataclass(frozen=True)
class Row:
    """One line of the report. Latencies in ms per call, `fps` frames per second with `workers`
    calls at once, `rss_mb` the peak resident memory of the process that measured it,
    `energy_mj_per_frame` None where power is not measured. `error` says why it could not run."""

    runtime: RuntimeName
    provider: str
    artifact: str
    precision: str
    workers: int
    threads: int | None
    latency_ms: dict[str, float] | None = None
    fps: float | None = None
    rss_mb: float | None = None
    energy_mj_per_frame: float | None = None
    parity: dict[str, float | None] | None = None
    error: str | None = None

    @classmethod
    def failed(cls, candidate: Candidate, reason: str) -> Row:
        c = candidate
        return cls(c.runtime, c.provider, c.artifact, c.precision, c.workers, c.threads, error=reason)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measure(
    candidate: Candidate,
    reference: Reference,
    frames: int,
    energy: Callable[[], EnergyMeter | None] = no_energy_meter,
) -> Row:
    """Load, check and time `candidate` in this process (see the module docstring)."""
    if candidate.unavailable:
        return Row.failed(candidate, candidate.unavailable)
    c = candidate
    runtime = load_runtime(c.runtime, Path(c.path), c.config, warmup=True, workers=c.workers, root=Path(c.root))
    with runtime:
        decoder = artifact_decoder(reference.decoder, runtime.metadata.end2end)  # as activation reads it
        detector = Detector(runtime, decoder, reference.conf, reference.iou, reference.max_det)
        tensor = reference.inputs[c.artifact]
        outputs = runtime.infer([tensor])
        # final detections (a HEF's NMS on the chip) have no raw reference values to compare with
        expected = list(reference.outputs[c.artifact]) if decoder == reference.decoder else []
        specs = runtime.outputs
        within = parity_fraction(outputs, expected, specs, reference.atol, reference.rtol) if expected else None
        _, transform = detector.prepare(reference.frame)
        found = detector.postprocess([dequantize(o, s) for o, s in zip(outputs, specs, strict=True)], transform)
        agreement = detection_agreement(found, reference.detections) if reference.detections is not None else None
        if decoder != reference.decoder:  # compared as detections instead, as activation does
            within = agreement
        meter = energy()
        before = meter() if meter else None
        latency, seconds = time_inference(runtime, tensor, frames, c.workers)
        after = meter() if meter else None
    joules = after - before if before is not None and after is not None else None
    return replace(
        Row.failed(c, ""),
        error=None,
        latency_ms=asdict(latency),
        fps=round(frames / seconds, 2) if seconds > 0 else None,
        rss_mb=round(peak_rss_mb(), 1),
        energy_mj_per_frame=round(joules * 1000 / frames, 2) if joules is not None else None,
        parity={
            "max_abs_err": _rounded(max_abs_error(outputs, expected, specs)),
            "detection_agreement": _rounded(agreement),
            "within_tolerance": _rounded(within),
        },
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _child(conn: Any, candidate: Candidate, reference: Reference, frames: int, energy: Any) -> None:
    try:
        row = measure(candidate, reference, frames, energy)
    except Exception as exc:  # the row says why; the report goes on
        row = Row.failed(candidate, f"{type(exc).__name__}: {first_line(exc)}")
    conn.send(row)
    conn.close()


def measure_isolated(
    candidate: Candidate,
    reference: Reference,
    frames: int,
    energy: Callable[[], EnergyMeter | None] = no_energy_meter,
    timeout_s: float = 600.0,
    clock: Callable[[], float] = time.monotonic,
) -> Row:
    """`measure` in a freshly spawned process: its own peak RSS, and a crash is a row's error.
    The caller's main module must be import-safe (``if __name__ == "__main__"``), as for any
    spawned process."""
    if candidate.unavailable:
        return Row.failed(candidate, candidate.unavailable)
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(send, candidate, reference, frames, energy), daemon=True)
    process.start()
    send.close()
    deadline = clock() + timeout_s
    try:
        while True:
            alive = process.is_alive()  # read before polling: a row sent just before exiting is not lost
            if receive.poll(0.2):
                row: Row = receive.recv()
                return row
            if not alive:
                return Row.failed(candidate, f"the measuring process died (exit code {process.exitcode})")
            if clock() > deadline:
                return Row.failed(candidate, f"timed out after {timeout_s:.0f} s")
    except EOFError:
        process.join(10)
        return Row.failed(candidate, f"the measuring process died (exit code {process.exitcode})")
    finally:
        if process.is_alive():
            process.terminate()
        process.join(10)
        receive.close()


def choose(rows: Sequence[Row], min_fraction: float, max_latency_ms: float | None = None) -> tuple[Row | None, str]:
    """The fastest row (highest `fps`) whose outputs are within the bundle's tolerance and whose
    p95 latency per frame is within `max_latency_ms` when given; with why, or why none."""
    usable, rejected = [], []
    for row in rows:
        label = f"{row.runtime}/{row.provider}/{row.artifact}/w{row.workers}"
        within = (row.parity or {}).get("within_tolerance")
        if row.error or row.fps is None or row.latency_ms is None:
            rejected.append(f"{label}: {row.error or 'not measured'}")
        elif within is None or within < min_fraction:
            rejected.append(f"{label}: parity {within} below {min_fraction}")
        elif max_latency_ms is not None and row.latency_ms["p95"] > max_latency_ms:
            rejected.append(f"{label}: p95 {row.latency_ms['p95']} ms over {max_latency_ms} ms")
        else:
            usable.append(row)
    if not usable:
        return None, "no configuration qualifies: " + "; ".join(rejected)
    best = max(usable, key=lambda r: r.fps or 0.0)
    limit = f", p95 <= {max_latency_ms} ms" if max_latency_ms is not None else ""
    return best, (
        f"fastest of {len(usable)} qualifying configuration(s) ({best.fps} FPS, parity >= {min_fraction}{limit})"
    )
