"""Sources through OpenCV's `cv2.VideoCapture`: video files (`FileSource`), and live cameras
(`CameraSource`: a V4L2 device, a GStreamer pipeline ending in ``appsink``, an RTSP or HTTP stream).
OpenCV loads with the first source opened, not with this module."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from pipelines.sources.frames import Frame, SourceError, redact_credentials


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

    @property
    def fps(self) -> float | None:
        """Frames per second as the container states (None when unknown or not open): a frame's
        time in the video is its index over it (the motion gate's clock for a file)."""
        import cv2

        fps = float(self._capture.get(cv2.CAP_PROP_FPS)) if self._capture is not None else 0.0
        return fps if fps > 0 else None

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
        self.name = redact_credentials(target)  # shown in the status and logs: no camera password
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
                device, cv2.CAP_V4L2, f"camera {self.name} (is it connected, and may this user open it?)", **props
            )
        elif kind == "gstreamer":
            if not _has_gstreamer():
                raise SourceError(
                    "this OpenCV build has no GStreamer support, needed for the pipeline "
                    f"{self.name!r}; install the distribution's python3-opencv (JetPack and "
                    "Raspberry Pi OS ship it with GStreamer) and create the venv with --system-site-packages"
                )
            self._capture = _open_capture(self.target, cv2.CAP_GSTREAMER, f"GStreamer pipeline {self.name!r}")
        else:
            self._capture = _open_capture(
                self.target, cv2.CAP_FFMPEG, f"stream {self.name} (check the URL, credentials and network)"
            )

    def read(self) -> Frame | None:
        if self._capture is None:
            self.open()
        ok, image = self._capture.read()
        if not ok or image is None:
            raise SourceError(f"{self.kind} source {self.name}: no frame (disconnected or stalled)")
        frame = Frame(self._index, time.monotonic(), image)
        self._index += 1
        return frame
