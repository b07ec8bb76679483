"""The camera tools a device has (probe, config check, the doctor's checks), the board recipes,
live streams through ffmpeg, and the daemon's cameras on pipe sources."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.cli import main
from agent.config.models import CamerasSection, FfmpegSection, PipelineSection
from agent.config.recipes import RECIPES, recipe
from agent.hardware.camera_tools import CameraTools, Tool, ffmpeg_input_args, find_camera_tools, source_problems
from agent.hardware.probe import Board, probe
from agent.serving.cameras import Cameras
from pipelines.pipe_commands import pipe_command, pipe_tool
from pipelines.sources import FrameSource, SourceError, open_source, source_kind
from tests.conftest import FAKES, REPO
from tests.mqtt_tools import wait_until
from tests.test_cameras import install_versions

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


@pytest.mark.parametrize("name", [r.name for r in RECIPES])
def test_every_recipe_is_a_valid_source_and_an_example_config(name: str, tmp_path: Path, capsys) -> None:
    found = recipe(name)
    assert found is not None
    PipelineSection(source=found.source)
    if pipe_tool(found.source):
        command = pipe_command(found.source)
        assert command.live, "every recipe is a camera"
    else:
        assert source_kind(found.source) == "camera"
    assert main(["config", "example", "--source", name, "--state-dir", str(tmp_path / "state")]) == 0
    example = tmp_path / "agent.yaml"
    example.write_text(capsys.readouterr().out)
    assert json.dumps(found.source) in example.read_text()
    assert "loop:" not in example.read_text(), "a camera is live: no loop"
    assert main(["config", "check", str(example)]) == 0
    assert "no problems found" in capsys.readouterr().out


def test_the_cameras_page_shows_every_recipe() -> None:
    text = (REPO / "docs" / "cameras.md").read_text()
    for found in RECIPES:
        assert f"`{found.name}`" in text and found.source in text, found.name


def test_probe_reports_the_camera_tools(gst: str, capsys) -> None:
    assert main(["probe", "--json"]) == 0
    cameras = json.loads(capsys.readouterr().out)["cameras"]
    assert cameras["gst_launch"]["path"] and "gst_elements" not in cameras
    assert main(["probe"]) == 0
    out = capsys.readouterr().out
    assert "camera tools:" in out and "GStreamer hardware decoders:" in out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def test_the_daemons_cameras_on_pipe_sources(
    gst: str, tmp_path: Path, keys: dict[str, Path], bundles: dict[str, Path], caplog
) -> None:
    """A gst: camera runs beside the Jetson CSI recipe, which this machine cannot run: the
    missing elements are logged at start and gst-launch's own words are in the camera's status."""
    versions = install_versions(tmp_path, keys, bundles)
    csi = recipe("jetson-csi")
    assert csi is not None
    sections = [
        PipelineSection(name="test", source="gst:videotestsrc is-live=true ! video/x-raw,width=320,height=240"),
        PipelineSection(name="csi", source=csi.source),
    ]
    cameras = Cameras(sections, probe(), "auto", options=CamerasSection(stall_timeout_s=5))
    try:
        cameras.activate(versions[0])
        wait_until(lambda: cameras.get("test").frames > 3, 60, "frames from gst-launch-1.0")
        status = wait_until(
            lambda: (s := cameras.get("csi").source_status.snapshot()).error and s, 60, "the CSI camera's failure"
        )
    finally:
        cameras.stop()
    assert "pipeline csi: GStreamer element nvarguscamerasrc is not installed" in caplog.text
    assert status.error is not None and "gst-launch-1.0 exited with code 1" in status.error
    assert any('no element "nvarguscamerasrc"' in line for line in status.output)
    assert cameras.stats() == []


def test_the_doctor_checks_pipe_sources(gst: str, tmp_path: Path, capsys) -> None:
    """``edge-agent doctor`` shares `source_problems`: the Jetson CSI recipe fails unopened with
    what to install; a gst: camera this machine can run delivers a real frame through gst-launch."""
    csi = recipe("jetson-csi")
    assert csi is not None
    config = tmp_path / "agent.yaml"
    test = "gst:videotestsrc ! video/x-raw,width=320,height=240"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\nallow_unsigned: true\npipelines:\n"
        f"  - {{name: test, source: '{test}'}}\n"
        f"  - {{name: csi, source: '{csi.source}'}}\n"
    )
    status = main(["doctor", "--config", str(config), "--root", str(FAKES / "rpi5"), "--timeout", "30", "--json"])
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert status == 1
    assert checks["camera test"]["status"] == "pass", checks["camera test"]
    assert checks["camera test"]["message"] == f"a 320x240 frame from {test}"
    csi_check = checks["camera csi"]
    assert csi_check["status"] == "fail"
    assert "GStreamer element nvarguscamerasrc is not installed" in csi_check["message"]
    assert "docs/cameras.md" in csi_check["fix"]
