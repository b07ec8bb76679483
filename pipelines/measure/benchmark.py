"""`edge-agent bench`: FPS, per-stage latency, dropped frames and peak memory of a model.

- ``pipeline`` mode runs the real pipeline on a file or a pipe source (every frame) or the
  synthetic scene:
  capture, preprocess, inference, decode + NMS, with capture and preprocessing overlapped.
- ``runtime`` mode times inference alone on one prepared tensor: the ceiling the pipeline
  is compared against.

With `workers` > 1 that many inference calls run at once on the one model (the pipeline's
inference threads; in runtime mode, as many bare loops in threads).

`compare_on` (``bench --against``) runs two models on the same frames of a source, one frame
at a time in the caller's thread (`pipelines.measure.comparison.compare_frame`, the daemon's
shadow's step), and returns their `AgreementReport`.
"""

from __future__ import annotations

import functools
import resource
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy.typing as npt

from pipelines.decoding.detector import CameraDetector, Detector, FrameDetector
from pipelines.gating import Gating
from pipelines.latency import LatencyWindow, Percentiles
from pipelines.measure.comparison import Agreement, AgreementReport, compare_frame
from pipelines.measure.second_stage import SecondStages, top1_same
from pipelines.motion import MotionDetector
from pipelines.motion_gate import MotionGate
from pipelines.pipeline import Pipeline, use_one_opencv_thread
from pipelines.sources.capture import FileSource
from pipelines.sources.frames import Frame, FrameSource, LimitedSource, SourceError
from pipelines.sources.scene_source import SyntheticSource
from pipelines.sources.specs import open_source, source_kind
from pipelines.worker import Worker
from runtimes.base import Runtime

DEFAULT_FRAMES = 300


def _source(spec: str, frames: int | None, loop: bool = True) -> tuple[FrameSource, int | None]:
    """The benchmark source and how many frames it will give (None: unknown). A pipe source
    (``gst:``, ``ffmpeg:``, ``rpicam:``) runs until its stream ends, or for `frames`. A file
    loops to give `frames` when `loop` (else it gives at most `frames`, each frame once)."""
    if spec == "synthetic":
        count = frames or DEFAULT_FRAMES
        return SyntheticSource(frames=count), count
    if source_kind(spec) == "pipe":
        pipe = open_source(spec)
        frames = frames or (DEFAULT_FRAMES if pipe.live else None)  # a camera never ends by itself
        return (LimitedSource(pipe, frames), frames) if frames else (pipe, None)
    file = FileSource(Path(spec), loop=loop and frames is not None)
    file.open()  # fails early, with the file's name, if it cannot be read
    if frames is None:
        return file, file.frame_count or None
    if not loop and file.frame_count:
        frames = min(frames, file.frame_count)
    return LimitedSource(file, frames), frames


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB: Linux's VmHWM, which starts again at exec
    (``ru_maxrss`` keeps the peak from before an exec: a spawned process would report its
    parent's), else ``ru_maxrss`` (KiB)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _progress(total: int | None, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="frame", leave=False)


def _tick(bar: Any) -> None:
    if bar is not None:
        bar.update(1)


def time_inference(
    runtime: Runtime, tensor: npt.NDArray[Any], count: int, workers: int = 1, tick: Callable[[], None] = lambda: None
) -> tuple[Percentiles, float]:
    """Run `runtime` `count` times on `tensor`, split over `workers` threads calling it at once;
    returns the per-call latency percentiles (ms) and the seconds it all took. A benchmark
    measurement, on purpose timed with the wall clock."""
    window = LatencyWindow(stages=("inference",), size=count)

    def loop(runs: int) -> None:
        for _ in range(runs):
            t0 = time.perf_counter()
            runtime.infer([tensor])
            window.record(inference=(time.perf_counter() - t0) * 1000)
            tick()

    shares = [count // workers + (i < count % workers) for i in range(workers)]
    threads = [
        Worker.once(f"bench-{i}", functools.partial(loop, runs), described="a benchmark loop")
        for i, runs in enumerate(shares)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return window.percentiles()["inference"], time.perf_counter() - start


def _bench_runtime(detector: Detector, source: FrameSource, count: int, bar: Any, workers: int) -> dict[str, Any]:
    """Inference alone, `count` times on the tensor prepared from the source's first frame,
    split over `workers` threads calling the runtime at once."""
    first = source.read()
    source.close()
    if first is None:
        raise SourceError(f"{source.name}: no frame to benchmark with")
    tensor, _ = detector.prepare(first.image)
    latency, seconds = time_inference(detector.runtime, tensor, count, workers, lambda: _tick(bar))
    return {
        "input_shape": list(tensor.shape),
        "frames": count,
        "seconds": seconds,
        "latency_ms": asdict(latency),
        "stages_ms": {"inference": asdict(latency)},
        "dropped": 0,
    }


def _bench_pipeline(
    detector: FrameDetector, source: FrameSource, bar: Any, workers: int, gating: Gating | None = None
) -> dict[str, Any]:
    """The whole pipeline on every frame of `source` (with `gating`, a camera's motion gate);
    a source failure ends it with the error."""
    shapes: list[list[int]] = []

    def tick(frame: Frame, _: Any) -> None:
        if not shapes:  # the tensor shape of a dynamic model depends on the frame size
            shapes.append(list(detector.prepare(frame.image)[0].shape))
        _tick(bar)

    use_one_opencv_thread()
    pipeline = Pipeline("bench", source, detector, sinks=[tick], workers=workers, gating=gating)
    start = time.perf_counter()
    pipeline.start()
    try:
        while not pipeline.wait(0.2):
            if pipeline.source_status.state == "reconnecting":
                raise SourceError(pipeline.source_status.error or f"{source.name} failed")
        seconds = time.perf_counter() - start
    finally:
        pipeline.stop()
    stats = pipeline.stats()
    stages = {stage: asdict(values) for stage, values in stats.latency_ms.items()}
    return {
        "input_shape": shapes[0] if shapes else [],
        "frames": stats.frames,
        "seconds": seconds,
        "latency_ms": stages.get("total", {"p50": 0.0, "p95": 0.0}),
        "stages_ms": stages,
        "dropped": stats.dropped,
        **({"inferred_frames": stats.inferred} if gating is not None else {}),
    }


def run_bench(
    runtime: Any,
    source_spec: str,
    frames: int | None,
    mode: str,
    progress: bool = False,
    workers: int = 1,
    motion: bool = False,
) -> dict[str, Any]:
    """Benchmark `runtime` (loaded, warmed up); returns the report as a dict (times in ms). With
    `motion` (pipeline mode), a camera's motion gate with its defaults: `inferred_frames` too."""
    detector = Detector(runtime)
    source, total = _source(source_spec, frames)
    bar = _progress(total, progress)
    try:
        if mode == "runtime":
            result = _bench_runtime(detector, source, total or DEFAULT_FRAMES, bar, workers)
        else:
            # as a daemon camera's: a frame waits for the model as its uint8 pixels (1.2 MB at 640x640),
            # not as the float tensor (4.9 MB); a bare Detector held five of those at 720p
            camera = CameraDetector(detector, detector.detection_filter)
            gating = Gating(MotionDetector(), MotionGate()) if motion else None
            result = _bench_pipeline(camera, source, bar, workers, gating)
    finally:
        if bar is not None:
            bar.close()
    seconds = result.pop("seconds")
    return {
        "model": runtime.model_path.name,
        "runtime": runtime.name,
        "mode": mode,
        "workers": workers,
        "source": source_spec,
        **result,
        "seconds": round(seconds, 3),
        "fps": round(result["frames"] / seconds, 2) if seconds > 0 else 0.0,
        "rss_mb": round(peak_rss_mb(), 1),
    }


def compare_on(
    serving: Detector,
    candidate: Detector,
    source_spec: str,
    frames: int | None = None,
    every: int = 1,
    progress: bool = False,
    stages: SecondStages | None = None,
) -> AgreementReport:
    """``bench --against``: `candidate` against `serving` on every `every`-th frame of the source
    (the first included), `frames` frames read at most (default: a file's every frame, once;
    a pipe's stream to its end; the synthetic scene's 300), each model on its own thresholds;
    with `stages`, both second stages on the crops of the serving model's detections, as the
    device's shadow does. A source failure ends it with the `SourceError`."""
    if every < 1:
        raise ValueError(f"every must be at least 1, got {every}")
    source, total = _source(source_spec, frames, loop=False)
    agreement, bar = Agreement(), _progress(total, progress)
    try:
        source.open()
        read = 0
        while (frame := source.read()) is not None:
            if read % every == 0:
                expected, _ = compare_frame(agreement, frame.image, serving, candidate)
                if stages is not None:
                    agreement.add_crops(top1_same(frame.image, expected, stages))
            read += 1
            _tick(bar)
    finally:
        source.close()
        if bar is not None:
            bar.close()
    return agreement.report()
