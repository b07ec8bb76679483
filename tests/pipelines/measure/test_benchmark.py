"""`pipelines.measure.benchmark` below `edge-agent bench` (tests/agent/cli/test_bench.py runs the
command): inference split over worker threads on a real ONNX Runtime, how many frames each kind
of source gives, the peak memory reading."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from testkit import DEMO_MODELS
from testkit.media import write_video

from pipelines.decoding.detector import Detector
from pipelines.measure.benchmark import DEFAULT_FRAMES, _source, peak_rss_mb, run_bench, time_inference
from pipelines.sources.frames import SourceError
from runtimes.registry import load_runtime


class Counted:
    """The real runtime, with each call's thread noted (the `Thread` itself: an ident is reused
    once its thread has ended, so two short-lived workers could read as one)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime, self.threads = runtime, list[threading.Thread]()
        self._lock = threading.Lock()

    def infer(self, inputs: list[Any]) -> Any:
        with self._lock:
            self.threads.append(threading.current_thread())
        return self.runtime.infer(inputs)


@pytest.mark.parametrize(("count", "workers", "shares"), [(10, 3, [4, 3, 3]), (7, 1, [7]), (2, 4, [1, 1])])
def test_inference_is_split_over_the_workers(count: int, workers: int, shares: list[int]) -> None:
    with load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx", warmup=False) as runtime:
        counted, ticks = Counted(runtime), []
        tensor = np.zeros((1, 3, 320, 320), np.float32)
        latency, seconds = time_inference(counted, tensor, count, workers, lambda: ticks.append(1))  # type: ignore[arg-type]
    assert len(counted.threads) == len(ticks) == count
    per_thread = sorted((counted.threads.count(t) for t in set(counted.threads)), reverse=True)
    assert per_thread == shares, "every call made once, in as many threads as asked (that have work)"
    assert 0 < latency.p50 <= latency.p95 and seconds > 0


def test_the_frames_each_source_gives(tmp_path: Path) -> None:
    video = write_video(tmp_path / "clip.avi", 12, size=(160, 120))
    assert _source("synthetic", None)[1] == DEFAULT_FRAMES
    assert _source("synthetic", 5)[1] == 5
    file, count = _source(str(video), None)
    assert count == 12
    file.close()
    looped, count = _source(str(video), 30)
    assert count == 30 and sum(1 for _ in iter(looped.read, None)) == 30, "a short file loops to the frames asked"
    looped.close()
    with pytest.raises(SourceError, match=r"nowhere\.mp4"):
        _source(str(tmp_path / "nowhere.mp4"), None)


def test_runtime_mode_reports_the_calls_it_made() -> None:
    with load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx") as runtime:
        report = run_bench(runtime, "synthetic", 6, "runtime", workers=2)
    assert (report["mode"], report["frames"], report["workers"], report["dropped"]) == ("runtime", 6, 2, 0)
    # `seconds` is rounded to the millisecond, `fps` is worked out before rounding
    assert 6 / report["fps"] == pytest.approx(report["seconds"], abs=0.0005 + 1e-6), "frames per second"
    assert report["stages_ms"] == {"inference": report["latency_ms"]}


def test_peak_memory_is_at_least_what_is_resident_now() -> None:
    assert peak_rss_mb() >= psutil.Process().memory_info().rss / 2**20 * 0.99


def test_pipeline_frames_wait_as_uint8_pixels_as_a_cameras_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pipeline bench holds each frame waiting for the model as a daemon camera does
    (`CameraDetector`: its uint8 pixels, normalised when the model runs), not as the float tensor
    four times its size: the bench's peak RSS is the daemon's figure (docs/benchmarks.md)."""
    compacted = []
    compact = Detector.compact

    def counted(self: Detector, frame: Any) -> Any:
        compacted.append(frame.shape)
        return compact(self, frame)

    monkeypatch.setattr(Detector, "compact", counted)
    with load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx") as runtime:
        assert np.issubdtype(runtime.inputs[0].dtype, np.floating), "a float input, which compact keeps as uint8"
        report = run_bench(runtime, "synthetic", 4, "pipeline")
    assert report["frames"] == 4 and report["input_shape"][1:] == list(runtime.inputs[0].shape[1:])
    assert len(compacted) >= 4, "every frame of the source compacted"
