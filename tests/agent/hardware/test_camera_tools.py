"""`agent.hardware.camera_tools`: the camera tools and hardware decoders a board has, and what it cannot run."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from testkit import FAKES

from agent.config.models import FfmpegSection
from agent.config.recipes import recipe
from agent.hardware.board import Board
from agent.hardware.camera_tools import CameraTools, Tool, ffmpeg_input_args, find_camera_tools, source_problems

#: what gst-inspect-1.0 and ffmpeg -decoders print on a Jetson Orin (JetPack 6), trimmed: these
#: answers stand in for a Jetson's programs, which cannot run here
JETSON_ANSWERS = {
    "gst-inspect-1.0": "coreelements:  fdsink: Filedescriptor Sink\n"
    "nvvideo4linux2:  nvv4l2decoder: NVIDIA v4l2 video decoder\n"
    "nvjpeg:  nvjpegdec: JPEG image decoder\n"
    "nvarguscamerasrc:  nvarguscamerasrc: NvArgusCameraSrc\n"
    "nvvidconv:  nvvidconv: NvVidConv Plugin\n"
    "videoconvertscale:  videoconvert: Colorspace converter\n"
    "y4menc:  y4menc: YUV4MPEG video encoder\n"
    "video4linux2:  v4l2src: Video (video4linux2) Source\n"
    "vorbis:  vorbisdec: Vorbis audio decoder\n\nTotal count: 9 plugins, 9 features\n",
    "gst-launch-1.0 --version": "gst-launch-1.0 version 1.20.3\nGStreamer 1.20.3\nhttps://launchpad.net\n",
    "ffmpeg -version": "ffmpeg version 4.4.2-0ubuntu0.22.04.1+nvidia Copyright (c) 2000-2021\n",
    "ffmpeg -hide_banner -decoders": "Decoders:\n V..... = Video\n ------\n V..... h264  H.264 / AVC\n"
    " V..... h264_nvv4l2dec  NVIDIA V4L2 H.264 decoder (codec h264)\n A..... aac  AAC\n",
}


def jetson_tools() -> CameraTools:
    def runner(argv: Sequence[str]) -> str | None:
        return JETSON_ANSWERS.get(" ".join([Path(argv[0]).name, *argv[1:]]))

    def which(name: str) -> str | None:
        return None if name in ("rpicam-vid", "libcamera-vid") else f"/usr/bin/{name}"

    return find_camera_tools(runner, which)


def test_a_jetsons_tools_and_hardware_decoders() -> None:
    tools = jetson_tools()
    assert tools.gst_launch == Tool("gst-launch-1.0", "/usr/bin/gst-launch-1.0", "GStreamer 1.20.3")
    assert tools.ffmpeg.version == "ffmpeg version 4.4.2-0ubuntu0.22.04.1+nvidia"
    assert tools.rpicam == Tool("rpicam-vid", None, None)
    assert tools.gst_hw_decoders == ("nvjpegdec", "nvv4l2decoder")
    assert tools.ffmpeg_hw_decoders == ("h264_nvv4l2dec",)
    csi = recipe("jetson-csi")
    assert csi is not None and source_problems(csi.source, tools) == []
    assert source_problems("rpicam:", tools) == [
        "rpicam-vid or libcamera-vid is not installed (Raspberry Pi OS: apt install rpicam-apps)"
    ]
    problems = source_problems("gst:libcamerasrc ! videoflip", tools)
    assert [p.split(" is not")[0] for p in problems] == [
        "GStreamer element libcamerasrc",
        "GStreamer element videoflip",
    ]
    assert "gstreamer1.0-libcamera" in problems[0]


def test_this_machines_tools_and_the_recipes_it_cannot_run(gst: str) -> None:
    tools = find_camera_tools()
    assert tools.gst_launch.path is not None and tools.gst_launch.version.startswith("GStreamer 1.")
    assert {"y4menc", "videoconvert", "videotestsrc"} <= tools.gst_elements
    assert source_problems("gst:videotestsrc ! videoflip", tools) == []
    assert source_problems("synthetic", tools) == [] and source_problems("/dev/video0", tools) == []
    csi = recipe("jetson-csi")
    assert csi is not None
    assert [p.split(" is not")[0] for p in source_problems(csi.source, tools)] == [
        "GStreamer element nvarguscamerasrc",
        "GStreamer element nvvidconv",
    ]


def test_the_stand_in_rpicam_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", f"{FAKES / 'rpi5' / 'usr' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    tools = find_camera_tools()
    assert tools.rpicam.version == "rpicam-apps build: stand-in (tests/fakes/rpi5)"
    assert source_problems("rpicam:--width 640", tools) == []


PI4 = Board("raspberry_pi", "Raspberry Pi 4 Model B Rev 1.5", "aarch64", 4, False)


PI5 = Board("raspberry_pi", "Raspberry Pi 5 Model B Rev 1.0", "aarch64", 4, False)


ORIN = Board("jetson", "NVIDIA Jetson Orin Nano Developer Kit", "aarch64", 6, True, "Orin", "36.3.0")


PC = Board("generic", "generic x86_64", "x86_64", 8, False)


def tools_listing(*decoders: str) -> CameraTools:
    none = Tool("x", None, None)
    return CameraTools(none, none, none, frozenset(), (), decoders)


@pytest.mark.parametrize(
    ("hwaccel", "board", "listed", "expected"),
    [
        ("auto", ORIN, ("h264_nvmpi", "h264_nvv4l2dec"), ("-c:v", "h264_nvv4l2dec")),
        ("auto", ORIN, ("h264_nvmpi",), ("-c:v", "h264_nvmpi")),
        ("auto", ORIN, ("h264_cuvid",), ()),  # a desktop GPU's decoder is not the Jetson's
        ("auto", PI4, ("h264_v4l2m2m",), ("-c:v", "h264_v4l2m2m")),
        ("auto", PI5, ("h264_v4l2m2m",), ()),  # the Pi 5 has no H.264 decoder block
        ("auto", PC, ("h264_v4l2m2m", "h264_cuvid"), ()),
        ("none", PI4, ("h264_v4l2m2m",), ()),
        (["-hwaccel", "drm"], PI5, (), ("-hwaccel", "drm")),
        ("auto", PI4, None, ()),  # the tools were not asked: software
    ],
)
def test_ffmpeg_decode_options_per_board(hwaccel, board: Board, listed, expected: tuple[str, ...]) -> None:
    tools = tools_listing(*listed) if listed is not None else None
    assert ffmpeg_input_args(hwaccel, board, tools) == expected
    FfmpegSection(hwaccel=hwaccel)  # every row is a valid config value
