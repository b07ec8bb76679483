"""`edge-agent bench`: FPS, per-stage latency, dropped frames and peak memory of a model.

- ``pipeline`` mode runs the real pipeline on a file (every frame) or the synthetic scene:
  capture, preprocess, inference, decode + NMS, with capture and preprocessing overlapped.
- ``runtime`` mode times inference alone on one prepared tensor: the ceiling the pipeline
  is compared against.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

from pipelines.detector import Detector
from pipelines.metrics import LatencyWindow
from pipelines.pipeline import Pipeline
from pipelines.sources import FileSource, Frame, FrameSource, SourceError, SyntheticSource

DEFAULT_FRAMES = 300


class LimitedSource:
    """Ends `source` after `limit` frames."""

    def __init__(self, source: FrameSource, limit: int) -> None:
        self.source, self.limit = source, limit
        self.name, self.live = source.name, source.live
        self._count = 0

    def open(self) -> None:
        self.source.open()

    def read(self) -> Frame | None:
        if self._count >= self.limit:
            return None
        frame = self.source.read()
        self._count += frame is not None
        return frame

    def close(self) -> None:
        self.source.close()


def _source(spec: str, frames: int | None) -> tuple[FrameSource, int | None]:
    """The benchmark source and how many frames it will give (None: unknown)."""
    if spec == "synthetic":
        count = frames or DEFAULT_FRAMES
        return SyntheticSource(frames=count), count
    file = FileSource(Path(spec), loop=frames is not None)
    file.open()  # fails early, with the file's name, if it cannot be read
    if frames is None:
        return file, file.frame_count or None
    return LimitedSource(file, frames), frames


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _progress(total: int | None, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="frame", leave=False)


def run_bench(runtime: Any, source_spec: str, frames: int | None, mode: str, progress: bool = False) -> dict[str, Any]:
    """Benchmark `runtime` (loaded, warmed up); returns the report as a dict (times in ms)."""
    detector = Detector(runtime)
    source, total = _source(source_spec, frames)
    bar = _progress(total, progress)
    try:
        if mode == "runtime":
            first = source.read()
            if first is None:
                raise SourceError(f"{source_spec}: no frame to benchmark with")
            source.close()
            tensor, _ = detector.prepare(first.image)
            count = total or DEFAULT_FRAMES
            window = LatencyWindow(stages=("inference",), size=count)
            start = time.perf_counter()
            for _ in range(count):
                t0 = time.perf_counter()
                runtime.infer([tensor])
                window.record(inference=(time.perf_counter() - t0) * 1000)
                if bar is not None:
                    bar.update(1)
            seconds = time.perf_counter() - start
            stages = window.percentiles()
            processed, dropped, shape = count, 0, tuple(tensor.shape)
            latency = stages["inference"]
        else:
            shapes: list[tuple[int, ...]] = []
            pipeline = Pipeline("bench", source, detector)

            def tick(frame: Frame, _: Any) -> None:
                if not shapes:
                    shapes.append(tuple(detector.prepare(frame.image)[0].shape))
                if bar is not None:
                    bar.update(1)

            pipeline.add_sink(tick)
            start = time.perf_counter()
            pipeline.start()
            pipeline.wait()
            seconds = time.perf_counter() - start
            pipeline.stop()
            stats = pipeline.stats()
            if stats["source_status"]["error"]:
                raise SourceError(stats["source_status"]["error"])
            processed, dropped = stats["frames"], stats["dropped"]
            stages = stats["latency_ms"]
            latency = stages.get("total", {"p50": 0.0, "p95": 0.0})
            shape = shapes[0] if shapes else ()
    finally:
        if bar is not None:
            bar.close()
    return {
        "model": runtime.model_path.name,
        "runtime": runtime.name,
        "mode": mode,
        "source": source_spec,
        "input_shape": list(shape),
        "frames": processed,
        "seconds": round(seconds, 3),
        "fps": round(processed / seconds, 2) if seconds > 0 else 0.0,
        "latency_ms": latency,
        "stages_ms": stages,
        "dropped": dropped,
        "rss_mb": round(peak_rss_mb(), 1),
    }
