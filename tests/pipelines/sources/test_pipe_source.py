"""`pipelines.sources.pipe_source` with real gst-launch-1.0 and ffmpeg: negotiation, scaling, short and
cut frames, stalls, missing tools, a dying process restarted, a live H.264 stream."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from testkit import DEMO_MODELS, FAKES
from testkit.media import write_video
from testkit.net import free_port, wait_until

from pipelines.backoff import Backoff
from pipelines.decoding.detector import Detector
from pipelines.pipeline import Pipeline
from pipelines.sources.capture import FileSource
from pipelines.sources.frames import Frame, FrameSource, SourceError
from pipelines.sources.pipe_commands import PipeCommand, pipe_command
from pipelines.sources.pipe_source import PipeSource
from pipelines.sources.rawvideo import RawVideo
from pipelines.sources.specs import open_source
from runtimes.registry import load_runtime


@pytest.mark.slow
def test_a_live_h264_stream_through_ffmpeg_and_its_end(ffmpeg: str) -> None:
    """A real H.264 stream over TCP (ffmpeg encoding a test pattern and serving it): decoded
    frames while it runs; when the server dies, the live source fails with ffmpeg's reason."""
    port = free_port()
    pattern = ["-re", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=15"]
    h264 = ["-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency", "-f", "mpegts"]
    server = subprocess.Popen(["ffmpeg", "-loglevel", "error", *pattern, *h264, f"tcp://127.0.0.1:{port}?listen=1"])
    source = open_source(f"ffmpeg:tcp://127.0.0.1:{port}")
    assert source.live
    try:
        wait_until(lambda: _opens(source), 20, "the stream server")
        frames = [source.read() for _ in range(5)]
        assert all(f is not None and f.image.shape == (240, 320, 3) for f in frames)
        server.kill()
        server.wait()
        with pytest.raises(SourceError, match=r"ffmpeg('s stream ended| exited with code)"):
            for _ in range(200):
                source.read()
    finally:
        server.kill()
        source.close()


def _opens(source: FrameSource) -> bool:
    """Whether the source opened (ffmpeg refused until the server listens)."""
    try:
        source.open()
    except SourceError:
        return False
    return True


FAST_RETRY = Backoff(initial=0.05, maximum=0.2, jitter=0.0)


@pytest.fixture
def fake_rpicam(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in rpicam-vid first on PATH."""
    folder = FAKES / "rpi5" / "usr" / "bin"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return folder / "rpicam-vid"


def read_all(source: PipeSource, limit: int = 1000) -> list[Frame]:
    frames = []
    source.open()
    try:
        while len(frames) < limit and (frame := source.read()) is not None:
            frames.append(frame)
    finally:
        source.close()
    return frames


def demo_detector() -> Detector:
    return Detector(load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx"))


def test_gst_videotestsrc_frames_are_negotiated_and_converted(gst: str) -> None:
    """A solid red test pattern: the size comes from the stream's header, the colour survives
    the I420 conversion (swapped chroma planes would make it blue)."""
    source = open_source(
        "gst:videotestsrc num-buffers=4 pattern=solid-color foreground-color=0xffff0000"
        " ! video/x-raw,width=320,height=240"
    )
    assert isinstance(source, PipeSource) and not source.live
    frames = read_all(source)
    assert [f.index for f in frames] == [0, 1, 2, 3]
    assert frames[0].image.shape == (240, 320, 3) and frames[0].image.dtype == np.uint8
    b, g, r = frames[0].image.reshape(-1, 3).mean(axis=0)
    assert r > 230 and g < 25 and b < 25


def test_gst_scaled_to_the_configured_size(gst: str) -> None:
    source = open_source("gst:videotestsrc num-buffers=2", width=160, height=96)
    assert [f.image.shape for f in read_all(source)] == [(96, 160, 3)] * 2


def test_gst_rows_padded_by_y4menc_are_reported_not_decoded(gst: str) -> None:
    """GStreamer's y4menc pads rows of a width that is not a multiple of 8: the missing FRAME
    marker stops the stream instead of shifted garbage."""
    source = open_source("gst:videotestsrc num-buffers=3 ! video/x-raw,width=162,height=100")
    source.open()
    try:
        source.read()
        with pytest.raises(SourceError, match=r"out of step.*multiple of 8"):
            source.read()
    finally:
        source.close()


def test_ffmpeg_on_a_generated_clip_matches_opencv(ffmpeg: str, tmp_path: Path) -> None:
    clip = write_video(tmp_path / "clip.avi", 12, size=(320, 240))
    source = open_source(f"ffmpeg:{clip}")
    assert isinstance(source, PipeSource) and not source.live
    frames = read_all(source)
    reference = FileSource(clip)
    reference.open()
    expected = [reference.read() for _ in range(12)]
    reference.close()
    assert len(frames) == 12
    for got, want in zip(frames, expected, strict=True):
        assert want is not None and got.image.shape == want.image.shape
        # 4:2:0 chroma costs a little colour precision, nothing more
        assert float(np.abs(got.image.astype(int) - want.image.astype(int)).mean()) < 6


def test_ffmpeg_loops_a_file_when_asked(ffmpeg: str, tmp_path: Path) -> None:
    clip = write_video(tmp_path / "clip.avi", 5, size=(160, 120))
    frames = read_all(open_source(f"ffmpeg:{clip}", loop=True), limit=12)
    assert len(frames) == 12


def test_rpicam_stand_in_frames(fake_rpicam: Path) -> None:
    """Raw YUV420 of the size the agent asked for: the white bar is where the stand-in drew it."""
    source = open_source("rpicam:--frames 3 --framerate 200", width=320, height=240)
    assert isinstance(source, PipeSource) and source.live
    assert source.command.argv[-4:] == ("--nopreview", "--flush", "-o", "-")
    source.open()
    try:
        frames = [source.read() for _ in range(3)]
    finally:
        source.close()
    for i, frame in enumerate(frames):
        assert frame is not None and frame.image.shape == (240, 320, 3)
        bright = np.flatnonzero(frame.image[120, :, 1] > 200)
        assert (bright.min(), bright.max()) == (16 * i, 16 * i + 31)


def test_a_short_last_frame_is_dropped(fake_rpicam: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_AGENT_FAKE_RPICAM_SHORT_LAST", "1")
    source = open_source("rpicam:--frames 2 --framerate 200 --width 128 --height 64")
    source.open()
    try:
        assert source.read() is not None and source.read() is not None
        with pytest.raises(SourceError, match=r"cut short \(6144 of 12288 bytes\) and dropped") as failure:
            source.read()
    finally:
        source.close()
    assert source.short_frames == 1
    assert any("stand-in 128x64" in line for line in failure.value.output)


def test_a_finite_stream_cut_mid_frame_ends_without_it(ffmpeg: str, tmp_path: Path) -> None:
    """A YUV4MPEG2 file cut in its fourth frame, replayed by `head`: three frames, then the end."""
    y4m = tmp_path / "clip.y4m"
    subprocess.run(
        [
            "ffmpeg",
            "-loglevel",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=64x48:rate=10",
            "-frames:v",
            "4",
            "-pix_fmt",
            "yuv420p",
            str(y4m),
        ],
        check=True,
    )
    frame_bytes = RawVideo(64, 48).frame_bytes + len(b"FRAME\n")
    cut = y4m.stat().st_size - frame_bytes // 2
    source = PipeSource("head", PipeCommand("ffmpeg", ("head", "-c", str(cut), str(y4m)), "y4m", None, live=False))
    frames = read_all(source)
    assert len(frames) == 3 and source.short_frames == 1


def test_a_stalled_process_fails_and_is_killed_on_close() -> None:
    command = PipeCommand(
        "gst", ("sh", "-c", "printf 'YUV4MPEG2 W64 H48 C420jpeg\\n'; exec sleep 60"), "y4m", None, True
    )
    source = PipeSource("stall", command, stall_timeout_s=0.3)
    source.open()
    process = source._process
    assert process is not None
    with pytest.raises(SourceError, match=r"no data for 0\.3 s \(stalled\)"):
        source.read()
    source.close()
    assert process.poll() is not None, "the process group is gone"


def test_a_missing_tool_says_how_to_install_it() -> None:
    source = PipeSource("gst:x", pipe_command("gst:videotestsrc"), which=lambda name: None)
    with pytest.raises(SourceError, match=r"gst-launch-1\.0 is not installed \(.*apt install gstreamer1\.0-tools"):
        source.open()


def test_rpicam_that_dies_mid_stream_is_restarted_and_reported(fake_rpicam: Path, monkeypatch) -> None:
    monkeypatch.setenv("EDGE_AGENT_FAKE_RPICAM_FAIL_AFTER", "3")
    source = open_source("rpicam:--framerate 100", width=128, height=64)
    pipeline = Pipeline("cam", source, demo_detector(), backoff=FAST_RETRY).start()
    try:
        status = wait_until(
            lambda: (s := pipeline.source_status.snapshot()).reconnects >= 2 and s, 30, "two restarts after deaths"
        )
        process = source._process
    finally:
        pipeline.stop()
    assert status.error is not None and "rpicam-vid exited with code 1" in status.error
    assert "camera disconnected" in status.error
    assert "ERROR: *** failed to dequeue buffer: camera disconnected ***" in status.output
    assert pipeline.frames >= 3
    assert process is None or process.poll() is not None, "stopping the pipeline ended the process"
    assert pipeline.source_status.snapshot().state == "stopped"
