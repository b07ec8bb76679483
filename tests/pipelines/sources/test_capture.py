"""`pipelines.sources.capture`: files (once, looped, truncated), cameras that are not there,
GStreamer and RTSP through OpenCV; an MJPG file's frames handed on undecoded."""

from __future__ import annotations

import itertools
from pathlib import Path

import cv2
import numpy as np
import pytest
from testkit.media import CountingDecoder, write_video

from pipelines.sources.capture import CameraSource, FileSource
from pipelines.sources.frames import JpegImage, SourceError


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


def test_an_mjpg_file_gives_its_frames_undecoded_and_each_decodes_once(tmp_path: Path) -> None:
    """FFmpeg's packets as they are (``CAP_PROP_FORMAT`` -1): a `JpegImage` per frame, decoded
    only when its pixels are read, to the picture FFmpeg's own decode gives (within the two
    decoders' rounding)."""
    path = write_video(tmp_path / "clip.avi", 6, size=(320, 240))
    decoder = CountingDecoder()
    source = FileSource(path, decoder=decoder)
    source.open()
    frames = [f for f in iter(source.read, None)]
    source.close()
    assert [f.index for f in frames] == list(range(6))
    assert all(isinstance(f.pixels, JpegImage) and f.size == (240, 320) for f in frames)
    assert decoder.calls == [], "nothing decoded while reading"
    capture = cv2.VideoCapture(str(path))
    for frame in frames[:3]:
        ok, expected = capture.read()
        assert ok and frame.image.shape == expected.shape
        assert np.abs(frame.image.astype(int) - expected.astype(int)).mean() < 2.0
        assert frame.image is frame.image
    capture.release()
    assert decoder.full == 3


def test_a_file_of_another_codec_gives_decoded_frames(tmp_path: Path) -> None:
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"XVID"), 10.0, (64, 48))
    if not writer.isOpened():
        pytest.skip("this OpenCV cannot write XVID")
    for value in range(0, 250, 50):
        writer.write(np.full((48, 64, 3), value, np.uint8))
    writer.release()
    source = FileSource(path)
    frame = source.read()
    source.close()
    assert frame is not None and isinstance(frame.pixels, np.ndarray) and frame.image.shape == (48, 64, 3)


def test_a_packet_that_is_no_jpeg_fails_once_then_the_source_is_decoded_by_opencv(tmp_path: Path) -> None:
    path = write_video(tmp_path / "clip.avi", 3)
    data = bytearray(path.read_bytes())
    first = data.find(b"\xff\xd8\xff")
    data[first : first + 2] = b"\x00\x00"  # the first frame's start-of-image marker gone
    path.write_bytes(bytes(data))
    source = FileSource(path)
    with pytest.raises(SourceError, match=r"frame 0 is not a JPEG"):
        source.read()
    source.close()
    source.open()  # as the pipeline reconnects: OpenCV decodes from now on
    frame = source.read()
    source.close()
    assert frame is not None and isinstance(frame.pixels, np.ndarray)
