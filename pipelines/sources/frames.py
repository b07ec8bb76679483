"""What every frame source gives and reports: `Frame`, the `FrameSource` protocol, `SourceError`,
the capture side's `SourceStatus`, and `GroundTruth` (what a synthetic frame really shows).

A source is opened, read frame by frame and closed. ``read()`` returns ``None`` at the end of a
finite source and raises `SourceError` when the device or stream fails; the pipeline then
reconnects with `pipelines.backoff.Backoff`. Live sources (cameras, streams, a paced synthetic
scene) produce frames at their own pace and the pipeline keeps only the newest; the others are
read as fast as they are consumed, every frame. The sources themselves: `capture` (files, V4L2,
RTSP and GStreamer through OpenCV), `pipe_source` (raw frames from gst-launch-1.0, ffmpeg or
rpicam-vid), `scene_source` (the synthetic scenes); `specs` turns a source string into one.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
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


@dataclass(frozen=True)
class Frame:
    """One captured image: BGR ``(H, W, 3) uint8``; `timestamp` in `time.monotonic()` seconds
    when it was captured; `truth` only for synthetic frames. `inferred` is False for a frame a
    camera's motion gate let pass without inference (`pipelines.motion.Gating`): its sinks get
    the last inferred frame's detections with it, as nothing moved since."""

    index: int
    timestamp: float
    image: npt.NDArray[Any]
    truth: GroundTruth | None = None
    inferred: bool = True


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
