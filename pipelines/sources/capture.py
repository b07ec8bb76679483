"""Sources through OpenCV's `cv2.VideoCapture`: video files (`FileSource`), and live cameras
(`CameraSource`: a V4L2 device, a GStreamer pipeline ending in ``appsink``, an RTSP or HTTP stream).
OpenCV loads with the first source opened, not with this module.

Where the frames come as JPEG, the source hands them on undecoded (`Frame.pixels` a
`pipelines.sources.frames.JpegImage`, decoded on first use): a file whose video is MJPG, read
through FFmpeg with ``CAP_PROP_FORMAT`` -1 (its packets as they are), and a V4L2 camera sending
MJPG, asked for (``mjpg``) or its own choice (``CAP_PROP_CONVERT_RGB`` 0: the driver's buffer).
Every other source, and one of those whose backend refuses the setting, delivers decoded BGR
frames as before."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from pipelines.sources.frames import Frame, JpegDecoder, JpegImage, SourceError, imdecode, redact_credentials


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
    """Holds a `cv2.VideoCapture` and releases it on close; `_raw` when it returns JPEG
    packets (`_pixels` wraps them), decoded by `decoder` (`cv2.imdecode`; a test's counter).
    A packet that is no JPEG ends raw mode for good (`_raw_refused`): the source fails once,
    and is reopened decoding its frames as OpenCV does."""

    _capture: Any = None
    _raw = False
    _raw_refused = False
    name: str
    decoder: JpegDecoder

    def _pixels(self, array: Any, index: int) -> Any:
        """What `read` returned, as a frame's pixels: a `JpegImage` in raw mode (decoded frames
        as they are: a backend may ignore the setting); a packet that is no JPEG raises."""
        if not self._raw or (array.ndim == 3 and array.shape[2] == 3):
            return array
        jpeg = JpegImage.of(array, self.decoder)
        if jpeg is None:
            self._raw_refused = True
            raise SourceError(
                f"{self.name}: frame {index} is not a JPEG ({array.size} bytes); reopening it decoded by OpenCV"
            )
        return jpeg

    def close(self) -> None:
        if self._capture is not None:
            self._capture.release()
            self._capture = None


class FileSource(_OpenCVCapture):
    """A video (or image) file, read once or in a loop; every frame is delivered."""

    live = False

    def __init__(self, path: Path, loop: bool = False, decoder: JpegDecoder | None = None) -> None:
        self.path, self.loop = path, loop
        self.name = f"file:{path}"
        self.decoder = decoder if decoder is not None else imdecode
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
        self._raw = not self._raw_refused and _mjpg(self._capture) and self._capture.getBackendName() == "FFMPEG"
        self._raw = self._raw and bool(self._capture.set(cv2.CAP_PROP_FORMAT, -1))

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
        frame = Frame(self._index, time.monotonic(), self._pixels(image, self._index))
        self._index += 1
        self._position += 1
        return frame


def _mjpg(capture: Any) -> bool:
    """Whether `capture`'s video is Motion JPEG (its FOURCC ``MJPG``)."""
    import cv2

    return int(capture.get(cv2.CAP_PROP_FOURCC)) == cv2.VideoWriter.fourcc(*"MJPG")


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
        decoder: JpegDecoder | None = None,
    ) -> None:
        self.target, self.width, self.height, self.fps, self.mjpg = target, width, height, fps, mjpg
        self.decoder = decoder if decoder is not None else imdecode
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
            # the driver's MJPG buffers, undecoded, whether asked for (`mjpg`) or what the camera
            # chose (OpenCV's V4L2 backend returns them with CONVERT_RGB off since 4.x)
            self._raw = not self._raw_refused and _mjpg(self._capture)
            self._raw = self._raw and bool(self._capture.set(cv2.CAP_PROP_CONVERT_RGB, 0))
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
        frame = Frame(self._index, time.monotonic(), self._pixels(image, self._index))
        self._index += 1
        return frame
