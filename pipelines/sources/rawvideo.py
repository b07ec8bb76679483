"""Raw video frames read from a pipe: their format, the YUV4MPEG2 framing, and BGR conversion.

A pipe source (`pipelines.sources.pipe_source`) reads one of two framings from a subprocess's stdout:

- ``y4m``: a YUV4MPEG2 stream, as GStreamer's ``y4menc`` and ffmpeg's ``-f yuv4mpegpipe``
  write it. The stream header (``YUV4MPEG2 W640 H480 F30:1 Ip A1:1 C420jpeg``) states the
  width, height and chroma layout the producer negotiated; each frame is ``FRAME`` + optional
  parameters + ``\\n``, then the planes. The header is the only source of the size, and a
  missing ``FRAME`` marker means the stream is out of step: it is reported, never decoded.
- ``raw``: bare planes of a size given in advance (``rpicam-vid --codec yuv420`` with the
  ``--width`` and ``--height`` the agent passed it).

Layouts: ``i420`` (planar 4:2:0, Y then U then V, ``width * height * 3 / 2`` bytes; width and
height even) and ``gray`` (Y only). `to_bgr` turns a frame into the BGR ``(H, W, 3) uint8``
image the pipeline expects. `FrameReader` reads exact byte counts from a file descriptor with a
deadline; it is used by one thread at a time (the pipeline's capture thread).
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy.typing as npt

Layout = Literal["i420", "gray"]
Framing = Literal["y4m", "raw"]

Y4M_MAGIC = b"YUV4MPEG2"
FRAME_MAGIC = b"FRAME"
_MAX_HEADER = 1024  # a Y4M stream or frame header longer than this is not one
#: Y4M colour spaces with the planar 4:2:0 layout of I420 (they differ only in chroma siting)
_Y4M_420 = frozenset({"420", "420jpeg", "420paldv", "420mpeg2"})


class RawVideoError(Exception):
    """The stream is not what it claims to be (bad header, out of step, unsupported layout)."""


@dataclass(frozen=True)
class RawVideo:
    """The size and layout of every frame of one stream; `width` and `height` in pixels."""

    width: int
    height: int
    layout: Layout = "i420"

    def __post_init__(self) -> None:
        if self.width < 2 or self.height < 2:
            raise RawVideoError(f"frame size {self.width}x{self.height} is too small")
        if self.layout == "i420" and (self.width % 2 or self.height % 2):
            raise RawVideoError(
                f"a 4:2:0 frame needs an even width and height, got {self.width}x{self.height}; "
                "scale the camera to an even size"
            )

    @property
    def frame_bytes(self) -> int:
        """Bytes of one frame's planes."""
        luma = self.width * self.height
        return luma * 3 // 2 if self.layout == "i420" else luma


def parse_y4m_header(line: bytes) -> RawVideo:
    """The frame format a YUV4MPEG2 stream header states (the line without its newline).
    Raises `RawVideoError` naming what is missing or unsupported."""
    words = line.split(b" ")
    if words[0] != Y4M_MAGIC:
        raise RawVideoError(f"not a YUV4MPEG2 stream: it starts with {line[:20]!r}")
    params = {w[:1].decode("ascii", "replace"): w[1:].decode("ascii", "replace") for w in words[1:] if w}
    try:
        width, height = int(params["W"]), int(params["H"])
    except (KeyError, ValueError) as exc:
        raise RawVideoError(f"YUV4MPEG2 header without a valid width and height: {line[:80]!r}") from exc
    colour = params.get("C", "420jpeg")  # the format's default
    if colour in _Y4M_420:
        return RawVideo(width, height, "i420")
    if colour == "mono":
        return RawVideo(width, height, "gray")
    raise RawVideoError(
        f"YUV4MPEG2 colour space C{colour} is not supported (4:2:0 or mono); convert to I420 before the pipe"
    )


def to_bgr(data: bytes | bytearray | memoryview, video: RawVideo) -> npt.NDArray[Any]:
    """One frame's planes as a BGR ``(H, W, 3) uint8`` image (a new array)."""
    import cv2
    import numpy as np

    planes = np.frombuffer(data, np.uint8, count=video.frame_bytes)
    if video.layout == "gray":
        return cv2.cvtColor(planes.reshape(video.height, video.width), cv2.COLOR_GRAY2BGR)
    stacked = planes.reshape(video.height * 3 // 2, video.width)
    return cv2.cvtColor(stacked, cv2.COLOR_YUV2BGR_I420)


class FrameReader:
    """Exact reads from a pipe's file descriptor, each bounded by a deadline.

    `read_exact(n)` returns `n` bytes, fewer at the end of the stream (the caller drops a short
    frame), and raises `TimeoutError` when no byte came for `timeout_s` seconds. `clock` is the
    monotonic clock the deadline is measured on.
    """

    def __init__(self, fd: int, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.fd, self.timeout_s, self._clock = fd, timeout_s, clock
        self._buffer = bytearray()
        self.eof = False

    def _fill(self, want: int) -> None:
        """Read until the buffer holds `want` bytes or the stream ends."""
        deadline = self._clock() + self.timeout_s
        while len(self._buffer) < want and not self.eof:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise TimeoutError(f"no data for {self.timeout_s:g} s")
            ready, _, _ = select.select([self.fd], [], [], min(remaining, 0.5))
            if not ready:
                continue
            chunk = os.read(self.fd, max(want - len(self._buffer), 1 << 16))
            if not chunk:
                self.eof = True
            else:
                self._buffer += chunk
                deadline = self._clock() + self.timeout_s  # data came: the stream is alive

    def read_exact(self, size: int) -> bytes:
        """`size` bytes, or fewer when the stream ended first."""
        self._fill(size)
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def read_line(self) -> bytes:
        """The bytes up to the next newline (without it); what is left when the stream ends.
        Raises `RawVideoError` when no newline comes within a header's length."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                return line
            if self.eof:
                line = bytes(self._buffer)
                self._buffer.clear()
                return line
            if len(self._buffer) > _MAX_HEADER:
                raise RawVideoError(f"no header line within {_MAX_HEADER} bytes: {bytes(self._buffer[:40])!r}")
            self._fill(len(self._buffer) + 1)
