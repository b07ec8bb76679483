"""Pipe sources with real subprocesses: gst-launch-1.0 (videotestsrc), ffmpeg on a generated
clip, and the stand-in rpicam-vid of tests/fakes/rpi5 (a script that writes real YUV420 frames,
since no camera is attached here); supervision: death, stalls, short frames, the pipeline's
restarts and stop."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

from agent.cli import main
from pipelines.backoff import Backoff
from pipelines.detector import Detector
from pipelines.pipe_commands import PipeCommand, PipeSettings, pipe_command
from pipelines.pipe_source import PipeSource
from pipelines.pipeline import Pipeline
from pipelines.rawvideo import RawVideo
from pipelines.sources import FileSource, Frame, SourceError, open_source, source_kind
from runtimes.registry import load_runtime
from tests.conftest import DEMO_MODELS, FAKES, write_video
from tests.mqtt_tools import wait_until

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


def test_bench_on_gst_and_ffmpeg_sources(gst: str, ffmpeg: str, tmp_path: Path, capsys) -> None:
    model = str(DEMO_MODELS / "demo_detector.onnx")
    gst = "gst:videotestsrc num-buffers=30 ! video/x-raw,width=640,height=480"
    assert main(["bench", model, "--source", gst, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["frames"], report["source"], report["dropped"]) == (30, gst, 0) and report["fps"] > 0
    clip = write_video(tmp_path / "clip.avi", 20, size=(320, 240))
    assert main(["bench", model, "--source", f"ffmpeg:{clip}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["frames"] == 20
    assert main(["bench", model, "--source", "gst:filesrc location=/nowhere.mp4 ! decodebin"]) == 1
    assert "gst-launch-1.0 exited with code" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("gst:", "nothing after the prefix"),
        ("gst:videotestsrc ! fdsink", "end the pipeline before fdsink"),
        ("gst:videotestsrc ! appsink", "end the pipeline before appsink"),
        ("ffmpeg:rtsp://cam/1 -rtsp_transport", "the input .* must come last"),
        ("ffmpeg:-i clip.mp4", "without -i"),
        ("ffmpeg:'unclosed", "No closing quotation"),
        ("rpicam:--codec h264", "the agent sets --codec"),
        ("rpicam:-o out.h264", "remove -o"),
        ("rpicam:--width 800", "width 800 is not a multiple of 64"),
        ("rpicam:--width wide", "whole numbers"),
        ("rpicam:--width 640 --height 479", "even width and height"),
    ],
)
def test_malformed_pipe_strings_are_refused(spec: str, error: str) -> None:
    with pytest.raises(SourceError, match=error):
        source_kind(spec)


@pytest.mark.parametrize(
    ("spec", "options", "live", "expected"),
    [
        ("gst:v4l2src device=/dev/video0 ! image/jpeg ! jpegdec", {}, True, "jpegdec ! videoconvert"),
        ("gst:videotestsrc is-live=true", {}, True, "videotestsrc is-live=true ! videoconvert"),
        ("gst:uridecodebin uri=rtsp://cam/1", {}, True, "uri=rtsp://cam/1"),
        (
            "gst:filesrc location=a.mp4 ! decodebin",
            {"width": 320, "height": 240, "fps": 29.97},
            False,
            "videoscale ! video/x-raw,width=320,height=240 ! videorate ! video/x-raw,framerate=2997/100",
        ),
        ("ffmpeg:rtsp://cam/1", {}, True, "-rtsp_transport tcp -i rtsp://cam/1"),
        (
            "ffmpeg:clip.mp4",
            {"loop": True, "width": 640, "height": 360},
            False,
            "-c:v h264_v4l2m2m -stream_loop -1 -i clip.mp4 -an -sn -vf scale=640:360",
        ),
        (
            "ffmpeg:-f v4l2 -input_format mjpeg /dev/video0",
            {"loop": True},
            True,
            "-loglevel warning -f v4l2 -input_format mjpeg -i /dev/video0",
        ),
        ("ffmpeg:-c:v hevc_v4l2m2m rtsp://cam/2", {}, True, "-loglevel warning -rtsp_transport tcp -c:v hevc_v4l2m2m"),
        ("rpicam:--width 1280 --height 720", {"fps": 15}, True, "--framerate 15 -t 0 --codec yuv420"),
    ],
)
def test_pipe_commands(spec: str, options: dict, live: bool, expected: str) -> None:
    settings = PipeSettings(ffmpeg_input_args=("-c:v", "h264_v4l2m2m"))
    command = pipe_command(spec, settings=settings, **options)
    assert command.live is live
    assert expected in " ".join(command.argv)
    if command.tool == "ffmpeg":
        assert command.argv[-5:] == ("-pix_fmt", "yuv420p", "-f", "yuv4mpegpipe", "-")
    if command.tool == "gst":
        assert " ".join(command.argv).endswith("videoconvert ! video/x-raw,format=I420 ! y4menc ! fdsink fd=1")


def test_decoded_planes_match_opencv() -> None:
    """`to_bgr` against OpenCV's own BGR -> I420 -> BGR round trip on a real image."""
    from pipelines.rawvideo import to_bgr
    from pipelines.synthetic import SyntheticScene

    image, _ = SyntheticScene(width=96, height=64, seed=3, size_range=(10, 30)).render(0)
    planes = cv2.cvtColor(image, cv2.COLOR_BGR2YUV_I420)
    assert np.array_equal(to_bgr(planes.tobytes(), RawVideo(96, 64)), cv2.cvtColor(planes, cv2.COLOR_YUV2BGR_I420))
