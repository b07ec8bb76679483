"""What every frame source gives and reports: `Frame`, the `FrameSource` protocol, `SourceError`,
the capture side's `SourceStatus`, and `GroundTruth` (what a synthetic frame really shows).

A source is opened, read frame by frame and closed. ``read()`` returns ``None`` at the end of a
finite source and raises `SourceError` when the device or stream fails; the pipeline then
reconnects with `pipelines.backoff.Backoff`. Live sources (cameras, streams, a paced synthetic
scene) produce frames at their own pace and the pipeline keeps only the newest; the others are
read as fast as they are consumed, every frame. The sources themselves: `capture` (files, V4L2,
RTSP and GStreamer through OpenCV), `pipe_source` (raw frames from gst-launch-1.0, ffmpeg or
rpicam-vid), `scene_source` (the synthetic scenes); `specs` turns a source string into one.

A source whose frames come compressed as JPEG (an MJPG file through FFmpeg, a V4L2 camera
sending MJPG) hands each on undecoded, as a `JpegImage`: its pixels are decoded once, on first
use (`Frame.image`), so a frame the motion gate lets pass is judged on a reduced decode
(`JpegImage.grey`) and never decoded whole unless something reads its pixels.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:  # numpy loads with the first source, not with this module
    import numpy as np
    import numpy.typing as npt

    from pipelines.decoding.detections import Detections


#: a URL's password (``scheme://user:PASSWORD@``; the user name is kept, the password ends at
#: the last ``@`` before the host) and GStreamer's ``user-pw=PASSWORD`` property
_CREDENTIALS = re.compile(
    r"(?P<keep>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*:)[^\s/'\"]*(?=@)|(?P<prop>\buser-pw=)(\"[^\"]*\"|'[^']*'|\S+)"
)
REDACTED = "***"


def redact_credentials(text: str) -> str:
    """`text` with the password of every URL in it (``rtsp://viewer:secret@10.0.0.41/``) and of
    every GStreamer ``user-pw=`` replaced by ``***`` (``rtsp://viewer:***@10.0.0.41/``): how a
    camera's source string, its errors and its tools' output may be shown (status documents,
    the page, logs, the doctor)."""
    return _CREDENTIALS.sub(lambda m: (m.group("keep") or m.group("prop")) + REDACTED, text)


class CredentialsFilter(logging.Filter):
    """A logging filter that rewrites a record whose message names a password
    (`redact_credentials`), for every handler it is added to (the record is shared, so the
    handlers after it see the redacted text too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted is the handler's to report
            return True
        redacted = redact_credentials(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


class SourceError(Exception):
    """A source cannot be opened or stopped delivering frames; the message says which and why.
    `output` holds the last lines a source's subprocess wrote to stderr (pipe sources). Both are
    kept with credentials redacted (`redact_credentials`): they reach the status documents."""

    def __init__(self, message: str, output: Sequence[str] = ()) -> None:
        super().__init__(redact_credentials(message))
        self.output = tuple(redact_credentials(line) for line in output)


#: the most bytes one compressed frame may have (a 4K JPEG at the highest quality is under 10 MB)
MAX_JPEG_BYTES = 32 * 1024 * 1024
#: the most segments read before a JPEG's frame header (SOFn); real files have under a dozen
MAX_JPEG_SEGMENTS = 64
#: libjpeg's DCT scalings that `JpegImage.grey` may decode at, largest first
_REDUCTIONS = (8, 4, 2)
#: decodes a JPEG buffer (``(n,) uint8``) with cv2.imdecode's flags; None where it cannot
JpegDecoder = Callable[["npt.NDArray[np.uint8]", int], "npt.NDArray[np.uint8] | None"]


def jpeg_size(data: bytes | bytearray | memoryview) -> tuple[int, int] | None:
    """``(height, width)`` of the JPEG image `data`, read from its frame header (SOF0-SOF15 but
    DHT, JPG and DAC) without decoding; None when `data` is not a JPEG or its header is cut or
    lies past `MAX_JPEG_SEGMENTS` segments."""
    view = memoryview(data)
    if len(view) < 4 or view[0] != 0xFF or view[1] != 0xD8:
        return None
    at = 2
    for _ in range(MAX_JPEG_SEGMENTS):
        while at < len(view) and view[at] == 0xFF and at + 1 < len(view) and view[at + 1] == 0xFF:
            at += 1  # fill bytes
        if at + 4 > len(view) or view[at] != 0xFF:
            return None
        marker, length = view[at + 1], (view[at + 2] << 8) | view[at + 3]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if length < 7 or at + 9 > len(view):
                return None
            height, width = (view[at + 5] << 8) | view[at + 6], (view[at + 7] << 8) | view[at + 8]
            return (height, width) if height and width else None
        if marker in (0xD9, 0xDA) or length < 2:  # the image or its scan began with no frame header
            return None
        at += 2 + length
    return None


def imdecode(data: npt.NDArray[np.uint8], flags: int) -> npt.NDArray[np.uint8] | None:
    """`cv2.imdecode(data, flags)` as ``uint8`` (None where it cannot decode): the decoder of
    every `JpegImage` but a test's."""
    import cv2
    import numpy as np

    decoded = cv2.imdecode(data, flags)
    return None if decoded is None else np.asarray(decoded, np.uint8)


class JpegImage:
    """One frame as its source delivered it, a JPEG (`data`, ``(n,) uint8``) of `height` x
    `width` pixels (read from its header, `jpeg_size`), decoded to BGR once, on the first call
    of `pixels` from any thread (the others wait for that decode and share it). `decoder` is
    `cv2.imdecode` unless a test counts the decodes.

    A JPEG whose entropy-coded data is broken decodes as libjpeg makes of it (a truncated one:
    grey below the cut, as FFmpeg shows it); one that cannot be decoded at all gives a black
    frame of its size, and `failed` says so (the camera's health check sees a black picture)."""

    def __init__(self, data: npt.NDArray[np.uint8], height: int, width: int, decoder: JpegDecoder = imdecode) -> None:
        self.data, self.height, self.width = data, height, width
        self._decoder = decoder
        self._lock = threading.Lock()
        self._pixels: npt.NDArray[np.uint8] | None = None
        self.failed = False

    @classmethod
    def of(cls, data: npt.NDArray[np.uint8], decoder: JpegDecoder = imdecode) -> JpegImage | None:
        """`data` (any shape of ``uint8``, as a capture returns its packet) as a `JpegImage`;
        None when it is not a JPEG with a readable frame header or is over `MAX_JPEG_BYTES`."""
        flat = data.reshape(-1)
        if flat.dtype.itemsize != 1 or flat.size > MAX_JPEG_BYTES:
            return None
        size = jpeg_size(flat.data)
        return None if size is None else cls(flat, size[0], size[1], decoder)

    @property
    def decoded(self) -> bool:
        """Whether the full picture was decoded already."""
        return self._pixels is not None

    def pixels(self) -> npt.NDArray[np.uint8]:
        """The BGR ``(height, width, 3) uint8`` picture, decoded on the first call only."""
        pixels = self._pixels
        if pixels is not None:
            return pixels
        with self._lock:
            if self._pixels is None:
                import cv2
                import numpy as np

                decoded = self._decoder(self.data, cv2.IMREAD_COLOR)
                if decoded is None or decoded.shape != (self.height, self.width, 3):
                    self.failed, decoded = True, np.zeros((self.height, self.width, 3), np.uint8)
                self._pixels = decoded
            return self._pixels

    def grey(self, least_width: int) -> npt.NDArray[np.uint8]:
        """The picture in grey, decoded at the largest of libjpeg's DCT scalings (1/8, 1/4, 1/2)
        that keeps it at least `least_width` pixels wide (whole where none does): far cheaper
        than `pixels`, and never decodes them. Taken from `pixels` instead when they are
        decoded already. Raises ValueError when it cannot be decoded."""
        import cv2

        if self._pixels is not None:
            return cv2.cvtColor(self._pixels, cv2.COLOR_BGR2GRAY)  # type: ignore[return-value]
        reduction = next((r for r in _REDUCTIONS if -(-self.width // r) >= least_width), 1)
        flags = {
            8: cv2.IMREAD_REDUCED_GRAYSCALE_8,
            4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
            2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
        }.get(reduction, cv2.IMREAD_GRAYSCALE)
        grey = self._decoder(self.data, flags)
        if grey is None or grey.ndim != 2:
            raise ValueError(f"a {self.width}x{self.height} JPEG of {self.data.size} bytes cannot be decoded")
        return grey


@dataclass(frozen=True)
class Frame:
    """One captured image: `pixels`, BGR ``(H, W, 3) uint8``, or a `JpegImage` decoded on first
    use of `image` (a frame of an MJPG source); `timestamp` in `time.monotonic()` seconds when it
    was captured; `truth` only for synthetic frames. `inferred` is False for a frame a camera's
    motion gate let pass without inference (`pipelines.motion.Gating`): its sinks get the last
    inferred frame's detections with it, as nothing moved since."""

    index: int
    timestamp: float
    pixels: npt.NDArray[Any] | JpegImage
    truth: GroundTruth | None = None
    inferred: bool = True

    @property
    def image(self) -> npt.NDArray[Any]:
        """The BGR ``(H, W, 3) uint8`` picture (a `JpegImage` decoded here, once)."""
        pixels = self.pixels
        return pixels.pixels() if isinstance(pixels, JpegImage) else pixels

    @property
    def size(self) -> tuple[int, int]:
        """``(height, width)`` in pixels, without decoding."""
        pixels = self.pixels
        if isinstance(pixels, JpegImage):
            return pixels.height, pixels.width
        height, width = pixels.shape[:2]
        return int(height), int(width)


class FrameSource(Protocol):
    """What the pipeline needs of a source; `name` is what is shown of it (credentials redacted)."""

    name: str
    live: bool

    def open(self) -> None: ...

    def read(self) -> Frame | None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class GroundTruth:
    """The shapes of one frame: boxes in frame pixels, classes, visible fractions (0..1) and
    identities (``(n,) int32``: the same object has the same id in every frame of a scene).

    The synthetic scene also gives, per shape: `obb` ``(n, 5) float32`` its rotated box ``cx, cy,
    w, h, angle`` (pixels, radians in [0, pi), ``w`` along the angle's direction); `keypoints`
    ``(n, 3, 3) float32`` a triangle's three vertices ``x, y, visible`` (visible 1.0 when no shape
    drawn later covers the vertex; all zeros for circles and squares); and, when asked for,
    `masks` ``(n, H, W) bool``, the pixels of each shape left visible.
    """

    detections: Detections
    visible: npt.NDArray[np.float32]
    ids: npt.NDArray[np.int32] | None = None
    obb: npt.NDArray[np.float32] | None = None
    keypoints: npt.NDArray[np.float32] | None = None
    masks: npt.NDArray[np.bool_] | None = None


class LimitedSource:
    """`source` cut off after `limit` frames (benchmarks of a looping file)."""

    def __init__(self, source: FrameSource, limit: int) -> None:
        self.source, self.limit = source, limit
        self.name, self.live = source.name, source.live
        self._count = 0

    @property
    def fps(self) -> float | None:
        """The source's own frame rate where it states one (a file's: the motion gate's clock)."""
        fps = getattr(self.source, "fps", None)
        return fps if isinstance(fps, (int, float)) else None

    def open(self) -> None:
        self.source.open()

    def read(self) -> Frame | None:
        if self._count >= self.limit:
            return None
        frame = self.source.read()
        self._count += frame is not None
        return frame

    def close(self) -> None:
        self.source.close()


SourceStateName = Literal["starting", "running", "reconnecting", "ended", "stopped"]


@dataclass(frozen=True)
class SourceState:
    """A camera's capture side at one moment: `state`; `error`, the last failure (kept after it
    recovered); `reconnects`, how many times it recovered; `output`, the last lines its
    subprocess wrote to stderr before that failure (pipe sources; empty otherwise)."""

    state: SourceStateName
    error: str | None
    reconnects: int
    output: tuple[str, ...] = ()


class SourceStatus:
    """What the capture side reports, set by the capture thread and read from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state: SourceStateName = "starting"
        self.error: str | None = None
        self.reconnects = 0
        self.output: tuple[str, ...] = ()

    def set(self, state: SourceStateName, error: str | None = None, output: Sequence[str] = ()) -> None:
        with self._lock:
            if state == "running" and self.state == "reconnecting":
                self.reconnects += 1
            self.state = state
            if error is not None:  # also a driver's own exception, which may name the URL
                self.error = redact_credentials(error)
                self.output = tuple(redact_credentials(line) for line in output)

    def snapshot(self) -> SourceState:
        with self._lock:
            return SourceState(self.state, self.error, self.reconnects, self.output)
