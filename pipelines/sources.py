"""Frame sources: video files, V4L2 cameras, GStreamer pipelines, RTSP streams, raw frames piped
from gst-launch / ffmpeg / rpicam-vid (`pipelines.pipe_source`), and the synthetic scene,
behind one small protocol.

A source is opened, read frame by frame and closed. ``read()`` returns ``None`` at the end of a
finite source and raises `SourceError` when the device or stream fails; the pipeline then
reconnects with `pipelines.backoff.Backoff`. Live sources (cameras, streams, a paced synthetic scene) produce
frames at their own pace and the pipeline keeps only the newest; the others are read as fast
as they are consumed, every frame.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:  # numpy and OpenCV load with the first source, not with this module
    import numpy.typing as npt

    from pipelines.pipe_commands import PipeSettings
    from pipelines.synthetic import GroundTruth, SyntheticScene
    from pipelines.traffic import TrafficScene


class SourceError(Exception):
    """A source cannot be opened or stopped delivering frames; the message says which and why.
    `output` holds the last lines a source's subprocess wrote to stderr (pipe sources)."""

    def __init__(self, message: str, output: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.output = tuple(output)


@dataclass(frozen=True)
class Frame:
    """One captured image: BGR ``(H, W, 3) uint8``; `timestamp` in `time.monotonic()` seconds
    when it was captured; `truth` only for synthetic frames."""

    index: int
    timestamp: float
    image: npt.NDArray[Any]
    truth: GroundTruth | None = None


class FrameSource(Protocol):
    """What the pipeline needs of a source."""

    name: str
    live: bool

    def open(self) -> None: ...

    def read(self) -> Frame | None: ...

    def close(self) -> None: ...


def _open_capture(target: Any, api: int, what: str, **props: float) -> Any:
    import cv2

    capture = cv2.VideoCapture(target, api)
    if not capture.isOpened():
        capture.release()
        raise SourceError(f"cannot open {what}")
    for prop, value in props.items():
        capture.set(getattr(cv2, prop), value)
    return capture


class _OpenCVCapture:
    """Holds a `cv2.VideoCapture` and releases it on close."""

    _capture: Any = None

    def close(self) -> None:
        if self._capture is not None:
            self._capture.release()
            self._capture = None


class FileSource(_OpenCVCapture):
    """A video (or image) file, read once or in a loop; every frame is delivered."""

    live = False

    def __init__(self, path: Path, loop: bool = False) -> None:
        self.path, self.loop = path, loop
        self.name = f"file:{path}"
        self._capture = None
        self._index = 0
        self._position = 0  # frames read in the current pass

    def open(self) -> None:
        import cv2

        self.close()
        if not self.path.is_file():
            raise SourceError(f"cannot open video file {self.path}: not found")
        self._capture = _open_capture(str(self.path), cv2.CAP_ANY, f"video file {self.path}: not a readable video")
        self._position = 0

    @property
    def frame_count(self) -> int:
        """Frames in the file as its container states (0 when unknown or not open)."""
        import cv2

        return int(self._capture.get(cv2.CAP_PROP_FRAME_COUNT)) if self._capture is not None else 0

    def read(self) -> Frame | None:
        if self._capture is None:
            self.open()
        ok, image = self._capture.read()
        if not ok:
            total = self.frame_count
            if total and self._position < total - 1:
                raise SourceError(f"video file {self.path}: read failed at frame {self._position} of {total}")
            if not self.loop:
                return None
            self.close()
            self.open()
            ok, image = self._capture.read()
            if not ok:
                raise SourceError(f"video file {self.path}: no frame after rewinding")
        frame = Frame(self._index, time.monotonic(), image)
        self._index += 1
        self._position += 1
        return frame


def _has_gstreamer() -> bool:
    import cv2

    return bool(re.search(r"GStreamer:\s*YES", cv2.getBuildInformation()))


class CameraSource(_OpenCVCapture):
    """A live camera or stream through OpenCV: a V4L2 device (``/dev/videoN`` or an index), a
    GStreamer pipeline ending in ``appsink``, or an ``rtsp://`` URL."""

    live = True

    def __init__(
        self,
        target: str,
        width: int | None = None,
        height: int | None = None,
        fps: float | None = None,
        mjpg: bool = False,
    ) -> None:
        self.target, self.width, self.height, self.fps, self.mjpg = target, width, height, fps, mjpg
        self.name = target
        self._capture = None
        self._index = 0

    @property
    def kind(self) -> str:
        if self.target.startswith(("rtsp://", "rtsps://", "http://", "https://")):
            return "stream"
        if self.target.isdigit() or self.target.startswith("/dev/video"):
            return "v4l2"
        return "gstreamer"

    def open(self) -> None:
        import cv2

        kind = self.kind
        if kind == "v4l2":
            device = int(self.target) if self.target.isdigit() else self.target
            props: dict[str, float] = {}
            if self.mjpg:
                props["CAP_PROP_FOURCC"] = float(cv2.VideoWriter.fourcc(*"MJPG"))
            if self.width:
                props["CAP_PROP_FRAME_WIDTH"] = self.width
            if self.height:
                props["CAP_PROP_FRAME_HEIGHT"] = self.height
            if self.fps:
                props["CAP_PROP_FPS"] = self.fps
            props["CAP_PROP_BUFFERSIZE"] = 1
            self._capture = _open_capture(
                device, cv2.CAP_V4L2, f"camera {self.target} (is it connected, and may this user open it?)", **props
            )
        elif kind == "gstreamer":
            if not _has_gstreamer():
                raise SourceError(
                    "this OpenCV build has no GStreamer support, needed for the pipeline "
                    f"{self.target!r}; install the distribution's python3-opencv (JetPack and "
                    "Raspberry Pi OS ship it with GStreamer) and create the venv with --system-site-packages"
                )
            self._capture = _open_capture(self.target, cv2.CAP_GSTREAMER, f"GStreamer pipeline {self.target!r}")
        else:
            self._capture = _open_capture(
                self.target, cv2.CAP_FFMPEG, f"stream {self.target} (check the URL, credentials and network)"
            )

    def read(self) -> Frame | None:
        if self._capture is None:
            self.open()
        ok, image = self._capture.read()
        if not ok or image is None:
            raise SourceError(f"{self.kind} source {self.target}: no frame (disconnected or stalled)")
        frame = Frame(self._index, time.monotonic(), image)
        self._index += 1
        return frame


class SyntheticSource:
    """The synthetic scene as a camera. With `fps` it is live and paced to real time; without,
    frames come as fast as they are read. `frames` bounds the clip (``None``: endless)."""

    def __init__(
        self,
        scene: SyntheticScene | TrafficScene | None = None,
        fps: float | None = None,
        frames: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from pipelines.synthetic import SyntheticScene

        self.scene = scene or SyntheticScene()
        self.fps, self.frames = fps, frames
        self.live = fps is not None
        kind = "synthetic" if isinstance(self.scene, SyntheticScene) else "traffic"
        self.name = f"{kind}:seed={self.scene.seed}"
        self._sleep, self._clock = sleep, clock
        self._index = 0
        self._next_due = 0.0

    def open(self) -> None:
        self._next_due = self._clock()

    def read(self) -> Frame | None:
        if self.frames is not None and self._index >= self.frames:
            return None
        if self.fps:
            delay = self._next_due - self._clock()
            if delay > 0:
                self._sleep(delay)
            self._next_due = max(self._next_due + 1 / self.fps, self._clock() - 1 / self.fps)
        image, truth = self.scene.render(self._index)
        frame = Frame(self._index, self._clock(), image, truth)
        self._index += 1
        return frame

    def close(self) -> None:
        pass


class LimitedSource:
    """`source` cut off after `limit` frames (benchmarks of a looping file)."""

    def __init__(self, source: FrameSource, limit: int) -> None:
        self.source, self.limit = source, limit
        self.name, self.live = source.name, source.live
        self._count = 0

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


def source_kind(spec: str) -> Literal["synthetic", "pipe", "camera", "file"]:
    """What a source string names (no I/O): ``synthetic[:SEED]`` or ``traffic[:SEED]`` (the
    tracking scene: objects coming and going, `pipelines.traffic`); a pipe (``gst:``, ``ffmpeg:``,
    ``rpicam:``: frames from a subprocess, `pipelines.pipe_commands`); a camera through OpenCV
    (``/dev/videoN`` or an index, ``rtsp://``, ``http(s)://``, a GStreamer pipeline: anything
    else containing ``!``); else a video file. Raises `SourceError` for a malformed synthetic
    seed or pipe string."""
    if spec in ("synthetic", "traffic") or spec.startswith(("synthetic:", "traffic:")):
        seed = spec.partition(":")[2]
        if seed and not seed.lstrip("-").isdigit():
            raise SourceError(f"{spec!r}: the synthetic scene's seed must be an integer")
        return "synthetic"
    from pipelines.pipe_commands import check_pipe_spec, pipe_tool

    if pipe_tool(spec) is not None:
        check_pipe_spec(spec)
        return "pipe"
    if spec.isdigit() or spec.startswith(("/dev/video", "rtsp://", "rtsps://", "http://", "https://")) or "!" in spec:
        return "camera"
    return "file"


def open_source(spec: str, loop: bool = False, pipe: PipeSettings | None = None, **camera: Any) -> FrameSource:
    """A source from a config/CLI string (see `source_kind`); `camera` holds the capture `width`,
    `height` and `fps` when given; `pipe` the settings of pipe sources."""
    kind = source_kind(spec)
    if kind == "synthetic":
        seed = int(spec.partition(":")[2] or 0)
        from pipelines.synthetic import SyntheticScene
        from pipelines.traffic import TrafficScene

        scene = TrafficScene(seed=seed) if spec.startswith("traffic") else SyntheticScene(seed=seed)
        return SyntheticSource(scene, fps=camera.get("fps"))
    if kind == "pipe":
        from pipelines.pipe_commands import PipeSettings, pipe_command
        from pipelines.pipe_source import PipeSource

        settings = pipe or PipeSettings()
        command = pipe_command(spec, loop=loop, settings=settings, **camera)
        return PipeSource(spec, command, stall_timeout_s=settings.stall_timeout_s)
    if kind == "camera":
        return CameraSource(spec, **camera)
    return FileSource(Path(spec), loop=loop)


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
            if error is not None:
                self.error, self.output = error, tuple(output)

    def snapshot(self) -> SourceState:
        with self._lock:
            return SourceState(self.state, self.error, self.reconnects, self.output)
