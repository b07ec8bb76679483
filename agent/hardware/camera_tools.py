"""The camera tools this device has, and whether a source string can run on it.

`find_camera_tools` asks the programs themselves, through an injectable command runner (each
call starts a process; ``gst-inspect-1.0`` can take seconds on its first run, while it builds
GStreamer's registry): ``gst-launch-1.0``, ``ffmpeg`` and ``rpicam-vid`` (or the older
``libcamera-vid``) found on ``PATH`` with their versions; every element ``gst-inspect-1.0``
lists, and among them the hardware video decoders (``nvv4l2decoder`` on a Jetson,
``v4l2h264dec`` on a Raspberry Pi 4, ``v4l2slh265dec``, VA-API, ...: GStreamer registers the
V4L2 ones only when the decoder device exists); the hardware decoders ``ffmpeg -decoders``
lists (compiled in: a listed decoder still needs its device).

`source_problems` is the check ``edge-agent probe``, ``config check`` and the status page's
doctor share: what stops a configured source from running here, each with what to install.
`ffmpeg_input_args` turns ``cameras.ffmpeg.hwaccel`` into ffmpeg options for this board. Called
from the CLI or, once per start, by the cameras; nothing here decides anything else.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from agent.hardware.board import Board
from agent.hardware.raspberry import run_command
from pipelines.sources.pipe_commands import PROGRAMS, PipeTool, gst_elements, pipe_tool
from pipelines.sources.pipe_source import INSTALL_HINTS

_GST_ELEMENT = re.compile(r"^[\w-]+:\s+([\w-]+):", re.MULTILINE)
_GST_HW_DECODER = re.compile(r"^(nv\w*dec(oder)?|v4l2\w*dec|va(api)?\w*dec|qsv\w*dec|msdk\w*dec|omx\w*dec)$")
_FFMPEG_DECODER = re.compile(r"^\s*V\S*\s+(\S+)", re.MULTILINE)
_FFMPEG_HW = re.compile(r"_(v4l2m2m|nvv4l2dec|nvmpi|cuvid|qsv|mmal|rkmpp|vaapi)$")
#: the hardware H.264 decoders ffmpeg may have, per board, in order of preference
BOARD_H264_DECODERS: dict[str, tuple[str, ...]] = {
    "jetson": ("h264_nvv4l2dec", "h264_nvmpi"),
    "raspberry_pi": ("h264_v4l2m2m",),
}
#: where a GStreamer element the recipes use comes from
ELEMENT_HINTS = {
    "nvarguscamerasrc": "a Jetson's CSI camera source, from JetPack's nvidia-l4t-gstreamer",
    "nvvidconv": "JetPack's nvidia-l4t-gstreamer",
    "nvv4l2decoder": "a Jetson's hardware decoder, from JetPack's nvidia-l4t-gstreamer",
    "v4l2h264dec": "a Raspberry Pi 4's hardware H.264 decoder, from gstreamer1.0-plugins-good; the Pi 5 has none",
    "v4l2slh265dec": "the Raspberry Pi 5's hardware HEVC decoder, from gstreamer1.0-plugins-bad",
    "libcamerasrc": "gstreamer1.0-libcamera",
    "rtspsrc": "gstreamer1.0-plugins-good",
    "y4menc": "gstreamer1.0-plugins-good; the agent needs it for every gst: source",
}

Runner = Callable[[Sequence[str]], str | None]


def _slow_runner(argv: Sequence[str]) -> str | None:
    return run_command(argv, timeout_s=60.0)  # gst-inspect-1.0's first run scans every plugin


@dataclass(frozen=True)
class Tool:
    """One program: its `path` (None: not installed) and the first line of its version."""

    name: str
    path: str | None
    version: str | None


@dataclass(frozen=True)
class CameraTools:
    """What the pipe sources can use here (see the module docstring)."""

    gst_launch: Tool
    ffmpeg: Tool
    rpicam: Tool
    gst_elements: frozenset[str]
    gst_hw_decoders: tuple[str, ...]
    ffmpeg_hw_decoders: tuple[str, ...]

    def tool(self, tool: PipeTool) -> Tool:
        return {"gst": self.gst_launch, "ffmpeg": self.ffmpeg, "rpicam": self.rpicam}[tool]

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        del document["gst_elements"]  # hundreds of names; the decoders are what a technician needs
        return document


def _tool(tool: PipeTool, which: Callable[[str], str | None], runner: Runner) -> Tool:
    for name in PROGRAMS[tool]:
        path = which(name)
        if path is not None:
            flag = "-version" if tool == "ffmpeg" else "--version"
            text = runner([path, flag]) or ""
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            lines = [line for line in lines if line.startswith("GStreamer ")] or lines  # gst: its library's
            return Tool(name, path, lines[0].split(" Copyright")[0] if lines else None)
    return Tool(PROGRAMS[tool][0], None, None)


def find_camera_tools(runner: Runner = _slow_runner, which: Callable[[str], str | None] = shutil.which) -> CameraTools:
    """Ask this device's programs what they can do (several processes; seconds at most)."""
    gst = _tool("gst", which, runner)
    ffmpeg = _tool("ffmpeg", which, runner)
    elements: frozenset[str] = frozenset()
    if gst.path is not None and (inspect := which("gst-inspect-1.0")) is not None:
        elements = frozenset(_GST_ELEMENT.findall(runner([inspect]) or ""))
    decoders: list[str] = []
    if ffmpeg.path is not None:
        decoders = _FFMPEG_DECODER.findall(runner([ffmpeg.path, "-hide_banner", "-decoders"]) or "")
    return CameraTools(
        gst_launch=gst,
        ffmpeg=ffmpeg,
        rpicam=_tool("rpicam", which, runner),
        gst_elements=elements,
        gst_hw_decoders=tuple(sorted(e for e in elements if _GST_HW_DECODER.match(e))),
        ffmpeg_hw_decoders=tuple(sorted(d for d in decoders if _FFMPEG_HW.search(d))),
    )


def source_problems(spec: str, tools: CameraTools) -> list[str]:
    """What stops the source `spec` from running on this device (empty: nothing known). Only
    pipe sources are checked: a missing program, or GStreamer elements it does not list."""
    tool = pipe_tool(spec)
    if tool is None:
        return []
    found = tools.tool(tool)
    if found.path is None:
        return [f"{' or '.join(PROGRAMS[tool])} is not installed ({INSTALL_HINTS[tool]})"]
    if tool != "gst":
        return []
    problems = []
    for element in dict.fromkeys([*gst_elements(spec.split(":", 1)[1]), "videoconvert", "y4menc"]):
        if element not in tools.gst_elements:
            hint = ELEMENT_HINTS.get(element, "check its plugin package: gst-inspect-1.0 lists what is installed")
            problems.append(f"GStreamer element {element} is not installed ({hint})")
    return problems


def ffmpeg_input_args(
    hwaccel: Literal["auto", "none"] | list[str], board: Board, tools: CameraTools | None
) -> tuple[str, ...]:
    """The ffmpeg options before ``-i`` for ``cameras.ffmpeg.hwaccel`` on `board`: given ones as
    they are, none, or (auto) the board's hardware H.264 decoder when this ffmpeg lists it
    (`tools` None: not asked, so software)."""
    if isinstance(hwaccel, list):
        return tuple(hwaccel)
    if hwaccel == "none" or tools is None or "Raspberry Pi 5" in board.model:  # the Pi 5: no H.264 decoder
        return ()
    listed = set(tools.ffmpeg_hw_decoders)
    return next((("-c:v", name) for name in BOARD_H264_DECODERS.get(board.kind, ()) if name in listed), ())
