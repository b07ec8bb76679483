"""Pipe source strings -> the command that writes raw frames to stdout (pure: no I/O).

Three tools, chosen by the source string's prefix:

- ``gst:PIPELINE`` runs ``gst-launch-1.0 -q PIPELINE ! [videoscale ! caps] [videorate ! caps]
  videoconvert ! video/x-raw,format=I420 ! y4menc ! fdsink fd=1``: the pipeline ends in system
  memory (Jetson: after ``nvvidconv``), the agent appends the rest. Frames arrive as YUV4MPEG2,
  whose header carries the size GStreamer negotiated.
- ``ffmpeg:[INPUT OPTIONS] URL_OR_FILE`` runs ``ffmpeg ... -i URL_OR_FILE -pix_fmt yuv420p -f
  yuv4mpegpipe -``; the board's hardware decode options (`PipeSettings.ffmpeg_input_args`) go
  before ``-i`` for streams and files unless the options choose a decoder themselves.
- ``rpicam:ARGS`` runs ``rpicam-vid ARGS --codec yuv420 --nopreview --flush -t 0 -o -`` (or
  ``libcamera-vid`` on older Raspberry Pi OS): raw planes of the ``--width`` and ``--height``
  given in ARGS or by the agent (640x480 when neither says).

A source is live (the pipeline keeps only the newest frame) when it is a camera or a network
stream; a file or a finite test pattern is read frame by frame. `PipeCommand.argv[0]` is the
program's name, looked up on ``PATH`` when it runs.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from pipelines.sources.frames import SourceError
from pipelines.sources.rawvideo import Framing, RawVideo, RawVideoError

PipeTool = Literal["gst", "ffmpeg", "rpicam"]
PIPE_PREFIXES: dict[str, PipeTool] = {"gst:": "gst", "ffmpeg:": "ffmpeg", "rpicam:": "rpicam"}
#: the programs each tool may be, in order of preference
PROGRAMS: dict[PipeTool, tuple[str, ...]] = {
    "gst": ("gst-launch-1.0",),
    "ffmpeg": ("ffmpeg",),
    "rpicam": ("rpicam-vid", "libcamera-vid"),
}
#: GStreamer elements that capture from a camera or the network (their pipelines are live)
LIVE_ELEMENTS = frozenset(
    {
        "v4l2src",
        "nvarguscamerasrc",
        "nvv4l2camerasrc",
        "libcamerasrc",
        "rtspsrc",
        "udpsrc",
        "tcpclientsrc",
        "souphttpsrc",
        "srtsrc",
        "rtmpsrc",
        "uvch264src",
    }
)
_SINKS = re.compile(r"\b(fdsink|appsink|filesink|autovideosink|fakesink|y4menc)\b")
_LIVE_URL = re.compile(r"^(rtsps?|rtmps?|https?|udp|tcp|srt|rtp)://", re.IGNORECASE)
_RPICAM_OWNED = ("--codec", "-o", "--output", "--segment", "--split", "--circular")
DEFAULT_SIZE = (640, 480)  # what rpicam-vid is asked for when nothing else says
RPICAM_ROW_ALIGN = 64  # rpicam-vid pads each YUV420 row to this many bytes


@dataclass(frozen=True)
class PipeSettings:
    """How pipe sources run (agent.yaml's ``cameras`` section): `ffmpeg_input_args`, the hardware
    decode options put before ``-i``; `rtsp_transport` for ``rtsp://`` inputs; `stall_timeout_s`,
    how long a source may go without a byte before it counts as failed."""

    ffmpeg_input_args: tuple[str, ...] = ()
    rtsp_transport: Literal["tcp", "udp"] = "tcp"
    stall_timeout_s: float = 15.0


@dataclass(frozen=True)
class PipeCommand:
    """A subprocess that writes frames to stdout. `video` is set for ``raw`` framing (the size was
    given); ``y4m`` streams state it in their header. `argv[0]` is the tool's first program
    (`PROGRAMS` lists the others tried when it is not installed)."""

    tool: PipeTool
    argv: tuple[str, ...]
    framing: Framing
    video: RawVideo | None
    live: bool


def pipe_tool(spec: str) -> PipeTool | None:
    """Which tool a source string names, or None when it is not a pipe source."""
    return next((tool for prefix, tool in PIPE_PREFIXES.items() if spec.startswith(prefix)), None)


def gst_elements(pipeline: str) -> list[str]:
    """The element names of a ``gst-launch-1.0`` description, in order (caps are skipped)."""
    names = []
    for part in pipeline.split("!"):
        words = part.strip().split()
        if not words:
            continue
        first = words[0]
        if "/" in first or "=" in first or first.startswith(("(", '"', "'")) or first.endswith("."):
            continue  # caps (video/x-raw,...), a property of a named element's pad, or a link by name
        names.append(first)
    return names


def _body(spec: str, tool: PipeTool) -> str:
    body = spec.split(":", 1)[1].strip()
    if not body:
        example = {"gst": "gst:videotestsrc", "ffmpeg": "ffmpeg:rtsp://camera/stream", "rpicam": "rpicam:--width 1280"}
        raise SourceError(f"{spec!r}: nothing after the prefix (e.g. {example[tool]!r})")
    return body


def _split(spec: str, body: str) -> list[str]:
    try:
        return shlex.split(body)
    except ValueError as exc:
        raise SourceError(f"{spec!r}: {exc} (quote values with spaces)") from exc


def check_pipe_spec(spec: str) -> PipeTool:
    """Check a pipe source string's form; raises `SourceError` saying what is wrong."""
    tool = pipe_tool(spec)
    if tool is None:
        raise SourceError(f"{spec!r} is not a pipe source ({', '.join(PIPE_PREFIXES)})")
    body = _body(spec, tool)
    if tool == "gst":
        found = _SINKS.search(body)
        if found:
            raise SourceError(
                f"{spec!r}: end the pipeline before {found.group(1)}; the agent appends the conversion, "
                "y4menc and fdsink itself"
            )
        if not gst_elements(body) or not _split(spec, body):
            raise SourceError(f"{spec!r}: no GStreamer element")
    elif tool == "ffmpeg":
        words = _split(spec, body)
        if words[-1].startswith("-"):
            raise SourceError(f"{spec!r}: the input (a URL or file) must come last, after its options")
        if "-i" in words:
            raise SourceError(f"{spec!r}: give the input without -i (ffmpeg:[OPTIONS] URL_OR_FILE)")
    else:
        words = _split(spec, body)
        owned = [w for w in words if w.split("=")[0] in _RPICAM_OWNED]
        if owned:
            raise SourceError(f"{spec!r}: the agent sets {', '.join(_RPICAM_OWNED[:3])} itself; remove {owned[0]}")
        _rpicam_size(spec, words, None, None)
    return tool


def _option(words: list[str], *names: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in `words`."""
    for i, word in enumerate(words):
        key, eq, value = word.partition("=")
        if key in names:
            if eq:
                return value
            return words[i + 1] if i + 1 < len(words) else None
    return None


def _rpicam_size(spec: str, words: list[str], width: int | None, height: int | None) -> RawVideo:
    given = _option(words, "--width"), _option(words, "--height")
    try:
        w = int(given[0]) if given[0] is not None else width or DEFAULT_SIZE[0]
        h = int(given[1]) if given[1] is not None else height or DEFAULT_SIZE[1]
    except ValueError as exc:
        raise SourceError(f"{spec!r}: --width and --height take whole numbers of pixels") from exc
    if w % RPICAM_ROW_ALIGN:
        raise SourceError(
            f"{spec!r}: width {w} is not a multiple of {RPICAM_ROW_ALIGN}; rpicam-vid pads each YUV420 row "
            f"to {RPICAM_ROW_ALIGN} bytes, so use a width such as 640, 1280, 1536, 1920 or 2304"
        )
    try:
        return RawVideo(w, h, "i420")
    except RawVideoError as exc:
        raise SourceError(f"{spec!r}: {exc}") from exc


def _rate(fps: float) -> str:
    """A frame rate as GStreamer's fraction (29.97 -> 2997/100)."""
    rate = Fraction(fps).limit_denominator(1001)
    return f"{rate.numerator}/{rate.denominator}"


def _gst(spec: str, body: str, width: int | None, height: int | None, fps: float | None) -> PipeCommand:
    tail = []
    if width and height:
        tail += ["videoscale", f"video/x-raw,width={width},height={height}"]
    if fps:
        tail += ["videorate", f"video/x-raw,framerate={_rate(fps)}"]
    tail += ["videoconvert", "video/x-raw,format=I420", "y4menc", "fdsink fd=1"]
    pipeline = " ! ".join([body, *tail])
    elements = gst_elements(body)
    live = elements[0] in LIVE_ELEMENTS or "is-live=true" in body.replace(" ", "")
    live = live or bool(re.search(r"uri=[\"']?(?!file:)[a-z]+://", body))
    # gst-launch-1.0 parses its arguments as words of the description, as a shell splits it
    return PipeCommand("gst", (PROGRAMS["gst"][0], "-q", *_split(spec, pipeline)), "y4m", None, live)


def _ffmpeg(
    spec: str,
    words: list[str],
    width: int | None,
    height: int | None,
    fps: float | None,
    loop: bool,
    settings: PipeSettings,
) -> PipeCommand:
    *options, source = words
    device = source.startswith("/dev/") or _option(options, "-f") in ("v4l2", "video4linux2")
    stream = bool(_LIVE_URL.match(source))
    argv = [PROGRAMS["ffmpeg"][0], "-hide_banner", "-nostdin", "-loglevel", "warning"]
    chooses_decoder = any(o in ("-c:v", "-codec:v", "-vcodec", "-hwaccel") for o in options)
    if not device and not chooses_decoder:
        argv += settings.ffmpeg_input_args
    if source.lower().startswith(("rtsp://", "rtsps://")) and "-rtsp_transport" not in options:
        argv += ["-rtsp_transport", settings.rtsp_transport]
    if loop and not (device or stream) and "-stream_loop" not in options:
        argv += ["-stream_loop", "-1"]
    argv += [*options, "-i", source, "-an", "-sn"]
    filters = [f"scale={width}:{height}"] if width and height else []
    filters += [f"fps={fps:g}"] if fps else []
    if filters:
        argv += ["-vf", ",".join(filters)]
    argv += ["-pix_fmt", "yuv420p", "-f", "yuv4mpegpipe", "-"]
    return PipeCommand("ffmpeg", tuple(argv), "y4m", None, device or stream)


def _rpicam(spec: str, words: list[str], width: int | None, height: int | None, fps: float | None) -> PipeCommand:
    video = _rpicam_size(spec, words, width, height)
    argv = [PROGRAMS["rpicam"][0], *words]
    if _option(words, "--width") is None:
        argv += ["--width", str(video.width)]
    if _option(words, "--height") is None:
        argv += ["--height", str(video.height)]
    if fps and _option(words, "--framerate") is None:
        argv += ["--framerate", f"{fps:g}"]
    if _option(words, "-t", "--timeout") is None:
        argv += ["-t", "0"]
    argv += ["--codec", "yuv420", "--nopreview", "--flush", "-o", "-"]
    return PipeCommand("rpicam", tuple(argv), "raw", video, True)


def pipe_command(
    spec: str,
    *,
    width: int | None = None,
    height: int | None = None,
    fps: float | None = None,
    loop: bool = False,
    settings: PipeSettings | None = None,
) -> PipeCommand:
    """The command for a pipe source string. `width`/`height` scale the frames (rpicam: the
    capture size, unless ARGS give it), `fps` limits the rate, `loop` repeats an ffmpeg file.
    Raises `SourceError` for a malformed string."""
    settings = settings or PipeSettings()
    tool = check_pipe_spec(spec)
    body = _body(spec, tool)
    if tool == "gst":
        return _gst(spec, body, width, height, fps)
    if tool == "ffmpeg":
        return _ffmpeg(spec, _split(spec, body), width, height, fps, loop, settings)
    return _rpicam(spec, _split(spec, body), width, height, fps)
