"""Frame sources and the reconnect backoff."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest

from pipelines.backoff import Backoff
from pipelines.sources import CameraSource, FileSource, SourceError, SyntheticSource, open_source
from tests.conftest import write_video


def test_file_source_reads_every_frame_once(tmp_path: Path) -> None:
    source = FileSource(write_video(tmp_path / "clip.avi", 12))
    source.open()
    frames = []
    while (frame := source.read()) is not None:
        frames.append(frame)
    source.close()
    assert [f.index for f in frames] == list(range(12))
    assert frames[0].image.shape == (120, 160, 3)
    assert all(b.timestamp >= a.timestamp for a, b in itertools.pairwise(frames))


def test_file_source_loops(tmp_path: Path) -> None:
    source = FileSource(write_video(tmp_path / "clip.avi", 5), loop=True)
    source.open()
    frames = [source.read() for _ in range(12)]
    assert [f.index for f in frames if f] == list(range(12))
    assert np.array_equal(frames[0].image, frames[5].image)


def test_file_source_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"cannot open video file .*missing\.avi: not found"):
        FileSource(tmp_path / "missing.avi").open()
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all" * 100)
    with pytest.raises(SourceError, match=r"junk\.mp4: not a readable video"):
        FileSource(junk).open()


def test_truncated_file_fails_mid_stream(tmp_path: Path) -> None:
    path = write_video(tmp_path / "clip.avi", 30)
    source = FileSource(path)
    source.open()
    assert source.read() is not None
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])  # the container's index now points past the end
    with pytest.raises(SourceError, match="read failed at frame"):
        for _ in range(40):
            source.read()


def test_synthetic_source_bounded_and_with_truth() -> None:
    source = SyntheticSource(frames=3)
    source.open()
    frames = [source.read() for _ in range(4)]
    assert frames[3] is None
    assert all(f is not None and f.truth is not None for f in frames[:3])
    assert not source.live and SyntheticSource(fps=30).live


class FakeClock:
    """Time that passes only when the source sleeps (or when a test says so)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_paced_synthetic_source_sleeps_to_its_fps() -> None:
    clock = FakeClock()
    source = SyntheticSource(fps=10, frames=6, sleep=clock.sleep, clock=clock)
    source.open()
    stamps = [frame.timestamp for frame in (source.read() for _ in range(3)) if frame]
    assert clock.slept == pytest.approx([0.1, 0.1])
    assert np.diff(stamps) == pytest.approx([0.1, 0.1])
    # a slow consumer (0.25 s late): two frames without sleeping, then back on the 0.1 s grid
    clock.now += 0.25
    source.read()
    source.read()
    assert clock.slept == pytest.approx([0.1, 0.1])
    source.read()
    assert clock.slept == pytest.approx([0.1, 0.1, 0.05])


def test_camera_that_is_not_there() -> None:
    with pytest.raises(SourceError, match=r"cannot open camera /dev/video97 \(is it connected"):
        CameraSource("/dev/video97").open()


def test_gstreamer_pipeline_without_gstreamer_support() -> None:
    from pipelines.sources import _has_gstreamer

    source = CameraSource("videotestsrc ! videoconvert ! appsink")
    assert source.kind == "gstreamer"
    if _has_gstreamer():
        pytest.skip("this OpenCV has GStreamer: the missing-support message cannot show")
    with pytest.raises(SourceError, match="no GStreamer support"):
        source.open()


def test_rtsp_stream_refused() -> None:
    source = CameraSource("rtsp://127.0.0.1:9/none")
    assert source.kind == "stream"
    with pytest.raises(SourceError, match=r"cannot open stream rtsp://127\.0\.0\.1:9/none"):
        source.open()


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("synthetic", SyntheticSource),
        ("synthetic:4", SyntheticSource),
        ("clip.mp4", FileSource),
        ("/dev/video0", CameraSource),
        ("0", CameraSource),
        ("rtsp://cam/1", CameraSource),
        ("nvarguscamerasrc ! nvvidconv ! appsink", CameraSource),
    ],
)
def test_open_source_dispatch(spec: str, kind: type) -> None:
    assert isinstance(open_source(spec), kind)


def test_backoff_grows_caps_and_resets() -> None:
    backoff = Backoff(initial=0.5, maximum=4.0, jitter=0.2, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(8)]
    for n, delay in enumerate(delays):
        base = min(4.0, 0.5 * 2**n)
        assert base * 0.8 <= delay <= base * 1.2
    backoff.reset()
    assert backoff.next_delay() <= 0.6
