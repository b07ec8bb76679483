"""`pipelines.sources.pipe_commands`: pipe source strings to commands; malformed ones refused."""

from __future__ import annotations

import pytest

from pipelines.sources.frames import SourceError
from pipelines.sources.pipe_commands import PipeSettings, pipe_command
from pipelines.sources.specs import source_kind


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
