"""`pipelines.sources.capture`: files (once, looped, truncated), cameras that are not there,
GStreamer and RTSP through OpenCV."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from testkit.media import write_video

from pipelines.sources.capture import CameraSource, FileSource
from pipelines.sources.frames import SourceError


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


def test_camera_that_is_not_there() -> None:
    with pytest.raises(SourceError, match=r"cannot open camera /dev/video97 \(is it connected"):
        CameraSource("/dev/video97").open()


def test_gstreamer_pipeline_without_gstreamer_support() -> None:
    from pipelines.sources.capture import _has_gstreamer

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
