"""`edge-agent bench`: FPS, per-stage latency, dropped frames and peak memory of a model (``--workers
auto`` measures 1 and 2 calls in flight, as the daemon's autotune does), or with ``--matrix`` the
optimisation report of a bundle on this device: every way to run it, each row in its own process.
``--classifier MODEL`` also measures a second stage: ms per classification of one tracked object.
``--against OTHER`` runs a candidate (OTHER) beside the serving model or bundle on the same frames
of ``--source`` and prints how far it agrees, the comparison the daemon's shadow makes
(docs/quality.md#from-the-bench-to-the-fleet).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.cli.args import positive_int, unit_interval
from runtimes.selection import Preference

if TYPE_CHECKING:
    from agent.bundles.record import CameraAgreementRecord, ShadowRecord
    from pipelines.decoding.classifier import Classifier
    from pipelines.decoding.detector import Detector
    from pipelines.measure.comparison import AgreementReport
    from pipelines.measure.matrix import Row
    from runtimes.base import Runtime
    from runtimes.selection import Choice, Preference
from agent.cli.args import RUNTIME_CHOICES
from agent.cli.failure import CliError


def add_parser(commands: Any) -> None:
    """Add ``edge-agent bench`` to the subparsers."""
    bench = commands.add_parser(
        "bench", help="measure FPS, latency and memory of a model, or with --matrix every way to run a bundle"
    )
    bench.add_argument(
        "model",
        type=Path,
        metavar="MODEL|BUNDLE",
        help="an .onnx or .tflite model; a bundle with --matrix; the serving model or bundle with --against",
    )
    bench.add_argument(
        "--source",
        help="a video file, 'synthetic' (default), or a pipe source: 'gst:PIPELINE', 'ffmpeg:URL_OR_FILE', "
        "'rpicam:ARGS' (docs/cameras.md); required with --against",
    )
    bench.add_argument(
        "--frames",
        type=positive_int,
        help="frames to process (default: the whole file, or 300); with --against, read at most this many",
    )
    bench.add_argument(
        "--against",
        type=Path,
        metavar="MODEL|BUNDLE",
        help="a candidate model or bundle: run it beside MODEL|BUNDLE on the same frames of --source and print "
        "how far it agrees (precision, recall, agreement, confident ratio, latency, per class), as the device's "
        "shadow compares a new version before it switches",
    )
    bench.add_argument(
        "--every",
        type=positive_int,
        default=1,
        help="with --against: compare every N-th frame of the source (default 1: every frame); the device's shadow "
        "samples its cameras' frames, by a share of time",
    )
    bench.add_argument(
        "--min-agreement",
        type=unit_interval,
        metavar="F",
        help="with --against: judge the comparison as the device's shadow would (0..1; the default minimum "
        "detections per camera of deployments.shadow apply): print agrees, disagrees or quiet, and exit 1 when the "
        "candidate disagrees",
    )
    bench.add_argument("--runtime", choices=RUNTIME_CHOICES, default="auto")
    bench.add_argument(
        "--mode",
        choices=("pipeline", "runtime"),
        default="pipeline",
        help="pipeline: capture to detections, every frame; runtime: inference alone on one prepared tensor",
    )
    bench.add_argument(
        "--workers",
        type=workers_arg,
        default="auto",
        help="inference calls in flight at once on one model (ONNX Runtime only): more throughput, each frame "
        "slower; each call gets cores/N threads. auto (default): the faster of 1 and 2 calls, measured briefly, "
        "as the daemon's autotune chooses",
    )
    bench.add_argument(
        "--matrix",
        action="store_true",
        help="the optimisation report of a bundle: every runtime x artifact / precision / provider / delegate "
        "on this device, each in its own process, with latency, FPS, peak RSS, energy and parity",
    )
    bench.add_argument(
        "--classifier",
        type=Path,
        metavar="MODEL",
        help="also measure a second stage: this classifier (.onnx or .tflite) on crops of the synthetic scene's "
        "shapes, one classification per tracked object (ms per classification)",
    )
    bench.add_argument(
        "--crops",
        type=positive_int,
        default=CLASSIFIER_CROPS,
        help=f"crops --classifier times (default {CLASSIFIER_CROPS})",
    )
    bench.add_argument(
        "--motion",
        action="store_true",
        help="pipeline mode: infer only the frames where something moves, as a camera with motion.enabled does "
        "(its defaults; docs/cameras.md): reports inferred_frames of frames, and the CPU it saved",
    )
    bench.add_argument("--config", type=Path, help="device config (YAML) for the runtimes' settings (--matrix)")
    bench.add_argument("--json", action="store_true", help="print one JSON object (--matrix: a list of rows)")


DEFAULT_MATRIX_FRAMES = 100
CLASSIFIER_CROPS = 200


AUTO_FRAMES = 15  # per variant, after the warm-up, for --workers auto


def workers_arg(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def run(args: argparse.Namespace) -> int:
    from agent.serving.loader import load_model
    from pipelines.measure.benchmark import run_bench
    from runtimes.base import compact_malloc

    if args.against is not None:
        return bench_against(args)
    if args.every != 1:
        raise CliError("--every picks the frames --against compares: give --against OTHER")
    if args.min_agreement is not None:
        raise CliError("--min-agreement judges what --against compares: give --against OTHER")
    if args.motion and (args.mode == "runtime" or args.matrix):
        raise CliError("--motion gates a camera's frames: only in --mode pipeline, not with --matrix")
    if args.matrix:
        return bench_matrix(args)
    args.source = args.source or "synthetic"
    if not args.model.is_file():
        raise CliError(f"model file not found: {args.model}")
    if args.classifier is not None and not args.classifier.is_file():
        raise CliError(f"classifier model file not found: {args.classifier}")
    compact_malloc()  # as the daemon does at start: the figures are the daemon's
    measured: dict[str, float] = {}
    if args.workers == "auto":
        workers, measured, loaded = auto_workers(args.model, args.runtime)
    else:
        workers, loaded = args.workers, None
    runtime, choice = loaded or load_model(args.model, args.runtime, workers=workers)
    with runtime:
        if workers > 1 and not runtime.concurrent:
            raise CliError(f"--workers {workers}: {runtime.name} cannot run one model from several threads")
        progress = sys.stderr.isatty() and not args.json
        report = run_bench(
            runtime, args.source, args.frames, args.mode, progress=progress, workers=workers, motion=args.motion
        )
    report["device"] = choice.device
    if measured:
        report["workers_auto_fps"] = measured
    if args.classifier is not None:
        report["classifier"] = classifier_cost(args.classifier, args.runtime, args.crops)
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"{report['model']} on {report['runtime']} ({choice.device}), {report['mode']} mode, source {report['source']}"
    )
    auto = f" (auto; FPS by workers: {measured})" if measured else ""
    print(
        f"  input {report['input_shape']}, {report['frames']} frames in {report['seconds']:.2f} s, "
        f"{report['workers']} worker(s){auto}"
    )
    latency = report["latency_ms"]
    print(f"  fps {report['fps']:.1f}   latency p50 {latency['p50']:.1f} ms  p95 {latency['p95']:.1f} ms")
    for stage, values in report["stages_ms"].items():
        print(f"    {stage:<12} p50 {values['p50']:7.2f} ms  p95 {values['p95']:7.2f} ms")
    print(f"  dropped {report['dropped']}   peak RSS {report['rss_mb']:.0f} MB")
    if args.motion:
        print(f"  motion: {report['inferred_frames']} of {report['frames']} frames inferred")
    if args.classifier is not None:
        cost = report["classifier"]
        ms = cost["ms_per_object"]
        print(
            f"  second stage {cost['model']} on {cost['runtime']}: {cost['crops']} crops, per tracked object "
            f"p50 {ms['p50']:.2f} ms  p95 {ms['p95']:.2f} ms  mean {ms['mean']:.2f} ms"
        )
    return 0


def classifier_cost(model: Path, preference: Preference, count: int) -> dict[str, Any]:
    """The second stage's cost: `model` (a classifier) on the best runtime here, timed on `count`
    crops of the synthetic scene's shapes (each crop as the daemon cuts it from the frame with
    the track's box, then `Classifier.classify`: preprocessing and inference), after a warm-up
    of 5. Returns ``{"model", "runtime", "crops", "ms_per_object": {"p50", "p95", "mean"}}``."""
    import time

    import numpy as np
    import numpy.typing as npt

    from agent.serving.loader import load_model
    from pipelines.decoding.classifier import Classifier
    from pipelines.decoding.decoders import DecoderError
    from pipelines.sources.synthetic import SyntheticScene
    from pipelines.tracking.analytics import crop_box

    runtime, choice = load_model(model, preference)
    with runtime:
        try:
            classifier = Classifier(runtime)
        except DecoderError as exc:
            raise CliError(f"--classifier {model.name}: {exc}") from exc
        crops: list[npt.NDArray[np.uint8]] = []
        scene, index = SyntheticScene(seed=0), 0
        while len(crops) < count + 5:
            image, truth = scene.render(index)
            shown = truth.detections.xyxy[truth.visible > 0.5]
            crops += [crop_box(image, box) for box in shown]
            index += 1
        for crop in crops[:5]:
            classifier.classify(crop)
        times = []
        for crop in crops[5 : count + 5]:
            start = time.perf_counter()
            classifier.classify(crop)
            times.append((time.perf_counter() - start) * 1000)
    ms = np.asarray(times)
    return {
        "model": model.name,
        "runtime": choice.runtime,
        "crops": len(times),
        "ms_per_object": {
            "p50": round(float(np.percentile(ms, 50)), 3),
            "p95": round(float(np.percentile(ms, 95)), 3),
            "mean": round(float(ms.mean()), 3),
        },
    }


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_rows(rows: list[Row]) -> None:
    print(
        f"{'runtime':<12}{'provider':<22}{'artifact':<30}{'prec':<6}{'w':>2}{'thr':>4}{'p50 ms':>9}{'p95 ms':>9}"
        f"{'FPS':>8}{'RSS MB':>8}{'mJ/fr':>7}{'max err':>9}{'det agr':>8}"
    )
    for row in rows:
        parity = row.parity or {}
        latency = row.latency_ms or {}
        line = (
            f"{row.runtime:<12}{row.provider[:21]:<22}{row.artifact[:29]:<30}{row.precision:<6}{row.workers:>2}"
            f"{_cell(row.threads):>4}{_cell(latency.get('p50'), 2):>9}{_cell(latency.get('p95'), 2):>9}"
            f"{_cell(row.fps):>8}{_cell(row.rss_mb, 0):>8}{_cell(row.energy_mj_per_frame):>7}"
            f"{_cell(parity.get('max_abs_err'), 4):>9}{_cell(parity.get('detection_agreement'), 2):>8}"
        )
        print(line + (f"  {row.error}" if row.error else ""))


def bench_matrix(args: argparse.Namespace) -> int:
    """Run the matrix of the bundle `args.model`; a table, or with ``--json`` a list of rows."""
    from agent.bundles.archive import Limits, unpack, verify_unpacked
    from agent.bundles.engine_settings import version_settings
    from agent.bundles.tuning import candidates, reference_of, run_matrix, with_prepared
    from agent.config.loading import load_config
    from agent.config.models import AgentConfig
    from agent.hardware.board import probe
    from pipelines.measure.matrix import choose

    bundle: Path = args.model
    if not bundle.is_file():
        raise CliError(f"bundle not found: {bundle}")
    if bundle.suffix.lower() in (".onnx", ".tflite"):
        raise CliError(f"--matrix measures a bundle (edge-agent bundle build makes one), not a model: {bundle}")
    config = load_config(args.config) if args.config else AgentConfig()
    frames = args.frames or DEFAULT_MATRIX_FRAMES
    board = probe()
    quiet = args.json

    def say(text: str) -> None:
        if not quiet:
            print(text, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="edge-agent-matrix-") as tmp:
        folder = Path(tmp)
        unpack(bundle, folder, Limits())
        verified = verify_unpacked(folder, (), allow_unsigned=True)  # hashes checked; nothing installed
        manifest = verified.manifest
        settings = version_settings(config.runtime_settings(), manifest)
        found = candidates(folder, manifest, board, settings, variants=True)
        found = with_prepared(found, folder, manifest, lambda name, p: say(f"building {name}: {p.fraction:.0%}"))
        reference = reference_of(folder, manifest, verified.reference)
        rows = run_matrix(found, reference, frames, on_row=lambda row: say(f"measured {row.runtime} {row.artifact}"))
    if args.json:
        print(json.dumps([row.to_json() for row in rows]))
        return 0
    print(
        f"{manifest.name} {manifest.version} on {board.model} ({board.arch}, {board.cpu_count} CPUs): "
        f"{frames} frames per row, inference alone; max err vs each artifact's reference outputs, "
        f"detections vs {reference.reference_artifact}"
    )
    print_rows(rows)
    best, why = choose(rows, manifest.reference.min_fraction)
    if best is not None:
        print(f"autotune would serve: {best.runtime} {best.provider} {best.artifact} x{best.workers}: {why}")
    else:
        print(f"autotune: {why}")
    return 0


def auto_workers(model: Path, preference: Preference) -> tuple[int, dict[str, float], tuple[Runtime, Choice] | None]:
    """``--workers auto`` of a plain bench: on a runtime that serves concurrent calls, time each
    `worker_variants` (calls in flight, threads each) briefly and take the fastest, as autotune
    does at activation; 1 elsewhere. Returns the workers, each variant's FPS, and the winner's
    runtime when it is the one measured last (still loaded: the run uses it instead of loading
    the model a third time, which raised the peak RSS; docs/benchmarks.md), else None."""
    from agent.serving.loader import load_model
    from pipelines.decoding.detector import Detector
    from pipelines.measure.benchmark import time_inference
    from pipelines.sources.synthetic import SyntheticScene
    from runtimes.base import usable_cores, worker_variants  # not agent.bundles.tuning's: 9 MB of imports

    measured: dict[str, float] = {}
    frame = SyntheticScene(seed=0).render(0)[0]
    last: tuple[Runtime, Choice] | None = None
    for workers, _ in worker_variants(usable_cores()):
        if last is not None:
            last[0].close()
        last = load_model(model, preference, workers=workers)
        runtime = last[0]
        if not runtime.concurrent:
            return 1, {}, last
        tensor, _ = Detector(runtime).prepare(frame)
        time_inference(runtime, tensor, 3, workers)  # warm-up
        _, seconds = time_inference(runtime, tensor, AUTO_FRAMES * workers, workers)
        measured[str(workers)] = round(AUTO_FRAMES * workers / seconds, 2)
    best = max(measured, key=lambda key: measured[key])
    if last is not None and best != list(measured)[-1]:
        last[0].close()
        last = None
    return int(best), measured, last


@dataclass(frozen=True)
class _Side:
    """One model of ``bench --against``: its detector, what it is called, where it ran, its
    labels, and a bundle's second stage (classifier, its labels, the detector labels it is for)."""

    detector: Detector
    name: str
    runtime: str
    device: str
    labels: Mapping[int, str]
    second_stage: tuple[Classifier, list[str], list[str]] | None = None

    def close(self) -> None:
        self.detector.close()
        if self.second_stage is not None:
            self.second_stage[0].runtime.close()


def _open_side(flag: str, path: Path, preference: Preference, folder: Path) -> _Side:
    """Load `path` (a model file, or a bundle unpacked and its hashes checked into `folder`:
    its manifest's decoder, thresholds and labels, as a camera serves it) on this device."""
    from agent.bundles.archive import Limits, unpack, verify_unpacked
    from agent.errors import BundleError
    from agent.hardware.board import probe
    from agent.serving.loader import load_model, open_classifier, open_detector
    from pipelines.decoding.decoders import DecoderError
    from pipelines.decoding.detector import Detector
    from runtimes.base import BackendError

    if not path.is_file():
        raise CliError(f"{flag}: file not found: {path}")
    try:
        if path.suffix.lower() in (".onnx", ".tflite"):
            runtime, choice = load_model(path, preference)
            try:
                detector = Detector(runtime)
            except DecoderError:
                runtime.close()
                raise
            names = runtime.metadata.names or {}
            return _Side(detector, path.name, choice.runtime, choice.device, names)
        folder.mkdir()
        unpack(path, folder, Limits())
        verify_unpacked(folder, (), allow_unsigned=True)  # hashes checked; nothing installed
        loaded = open_detector(folder, probe(), preference)
        try:
            stage = open_classifier(folder, probe(), preference)
        except BundleError:
            loaded.detector.close()
            raise
    except (BackendError, BundleError, DecoderError) as exc:
        raise CliError(f"{flag} {path.name}: {exc}") from exc
    manifest = loaded.manifest
    labels = dict(enumerate(manifest.labels))
    name = f"{manifest.name} {manifest.version}"
    second = (stage.classifier, stage.stage.labels, stage.stage.for_labels) if stage is not None else None
    return _Side(loaded.detector, name, loaded.choice.runtime, loaded.choice.device, labels, second)


def bench_against(args: argparse.Namespace) -> int:
    """``bench MODEL|BUNDLE --against OTHER --source CLIP``: OTHER (the candidate) against the
    serving MODEL|BUNDLE on the same frames; a table, or with ``--json`` one object: the two
    models and the comparison as the deployment record keeps a camera's shadow
    (`agent.bundles.record.CameraAgreementRecord`, the source as its camera)."""
    from agent.bundles.record import CameraAgreementRecord
    from pipelines.measure.benchmark import compare_on
    from pipelines.measure.second_stage import SecondStages

    if args.source is None:
        raise CliError(
            "--against compares two models on the same frames: give them with --source CLIP "
            "(a video file, 'synthetic' or a pipe source)"
        )
    refused = {
        "--matrix": args.matrix,
        "--classifier": args.classifier is not None,
        "--mode runtime": args.mode == "runtime",
    }
    for flag, given in refused.items():
        if given:
            raise CliError(f"--against compares detections frame by frame: not with {flag}")
    with tempfile.TemporaryDirectory(prefix="edge-agent-against-") as tmp, contextlib.ExitStack() as stack:
        serving = _open_side("MODEL|BUNDLE", args.model, args.runtime, Path(tmp) / "serving")
        stack.callback(serving.close)
        candidate = _open_side("--against", args.against, args.runtime, Path(tmp) / "candidate")
        stack.callback(candidate.close)
        stages = None
        if serving.second_stage is not None and candidate.second_stage is not None:
            detector_labels = [serving.labels[i] for i in sorted(serving.labels)]
            stages = SecondStages.of(serving.second_stage, candidate.second_stage, detector_labels)
        progress = sys.stderr.isatty() and not args.json
        report = compare_on(
            serving.detector, candidate.detector, args.source, args.frames, args.every, progress, stages
        )
    labels = {**candidate.labels, **serving.labels}  # the serving version's names first
    record = CameraAgreementRecord.of(args.source, report, labels.get)
    verdict = _verdict(args.source, report, args.min_agreement, labels.get) if args.min_agreement is not None else None
    status = 1 if verdict is not None and verdict.outcome == "disagrees" else 0
    if args.json:
        sides = {
            side: {"model": s.name, "runtime": s.runtime, "device": s.device}
            for side, s in (("serving", serving), ("candidate", candidate))
        }
        judged = {"verdict": {"outcome": verdict.outcome, "message": verdict.message}} if verdict else {}
        print(json.dumps({**sides, "every": args.every, "comparison": asdict(record), **judged}))
        return status
    print_agreement(record, serving, candidate, args.every)
    if verdict is not None:
        print(f"verdict: {verdict.outcome}: {verdict.message}")
    return status


def _verdict(
    source: str, report: AgreementReport, min_agreement: float, label: Callable[[int], str | None]
) -> ShadowRecord:
    """The comparison judged as the device's shadow judges a camera (`agent.deployment.quality`),
    with agent.yaml's default minimum detections."""
    from agent.config.models import ShadowSection
    from agent.deployment.quality import ShadowJudge, ShadowPlan

    defaults = ShadowSection()
    plan = ShadowPlan(
        duration_s=None,
        frames=report.frames,
        max_s=0.0,
        min_agreement=min_agreement,
        min_detections=defaults.min_detections,
    )
    return ShadowJudge(plan, 0.0, label).verdict({source: report}, 0.0)


def _ratio_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_agreement(record: CameraAgreementRecord, serving: _Side, candidate: _Side, every: int) -> None:
    """The comparison as a table: the totals, then one row per class."""
    sampled = f" (one in {every})" if every > 1 else ""
    print(
        f"candidate {candidate.name} ({candidate.runtime}, {candidate.device}) against serving {serving.name} "
        f"({serving.runtime}, {serving.device})"
    )
    print(f"  source {record.camera}: {record.frames} frames compared{sampled}")
    print(
        f"  detections: serving {record.serving}, candidate {record.candidate}, matched {record.matched} "
        f"(IoU >= 0.5, same class)"
    )
    print(
        f"  precision {record.precision:.2f}   recall {record.recall:.2f}   agreement {record.agreement:.2f}   "
        f"confident ratio {_ratio_cell(record.confident_ratio)}"
    )
    if record.task is not None:
        print(f"  task measure ({record.task}) {_ratio_cell(record.task_score)}")
    if record.top1 is not None:
        print(f"  second stage: top-1 agreement {record.top1:.2f} over {record.crops} crops")
    print(f"  latency p50: serving {_cell(record.serving_ms, 2)} ms   candidate {_cell(record.candidate_ms, 2)} ms")
    print(f"  {'class':<16}{'serving':>9}{'candidate':>11}{'matched':>9}{'agreement':>11}{'conf ratio':>12}")
    for c in record.classes:
        label = c.label or f"class {c.class_id}"
        print(
            f"  {label[:15]:<16}{c.serving:>9}{c.candidate:>11}{c.matched:>9}{c.agreement:>11.2f}"
            f"{_ratio_cell(c.confident_ratio):>12}"
        )
