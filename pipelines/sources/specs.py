"""Source strings -> sources (docs/cameras.md): what a string names (`source_kind`, no I/O) and
the source it opens (`open_source`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pipelines.sources.capture import CameraSource, FileSource
from pipelines.sources.frames import FrameSource, SourceError
from pipelines.sources.pipe_commands import PipeSettings, check_pipe_spec, pipe_command, pipe_tool
from pipelines.sources.scene_source import SyntheticSource

#: the synthetic scenes' source prefixes: the shapes, and the tracking scene (``traffic`` is its
#: older name, still accepted)
SCENES = ("synthetic", "tracking", "traffic")


def source_kind(spec: str) -> Literal["synthetic", "pipe", "camera", "file"]:
    """What a source string names (no I/O): ``synthetic[:SEED]`` or ``tracking[:SEED]`` (the
    tracking scene: objects coming and going, `pipelines.sources.tracking_scene`; ``traffic`` is
    its older name); a pipe (``gst:``, ``ffmpeg:``, ``rpicam:``: frames from a subprocess,
    `pipelines.sources.pipe_commands`); a camera through OpenCV
    (``/dev/videoN`` or an index, ``rtsp://``, ``http(s)://``, a GStreamer pipeline: anything
    else containing ``!``); else a video file. Raises `SourceError` for a malformed synthetic
    seed or pipe string."""
    if spec.partition(":")[0] in SCENES:
        seed = spec.partition(":")[2]
        if seed and not seed.lstrip("-").isdigit():
            raise SourceError(f"{spec!r}: the synthetic scene's seed must be an integer")
        return "synthetic"
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
        from pipelines.sources.synthetic import SyntheticScene  # numpy and OpenCV load with the scene
        from pipelines.sources.tracking_scene import TrackingScene

        # the synthetic scene renders at the camera's width and height when given (the tracking
        # scene's lanes are laid out for its own 640x480)
        width, height = int(camera.get("width") or 640), int(camera.get("height") or 480)
        synthetic = spec.startswith("synthetic")
        scene = SyntheticScene(width, height, seed=seed) if synthetic else TrackingScene(seed=seed)
        return SyntheticSource(scene, fps=camera.get("fps"))
    if kind == "pipe":
        from pipelines.sources.pipe_source import PipeSource

        settings = pipe or PipeSettings()
        command = pipe_command(spec, loop=loop, settings=settings, **camera)
        return PipeSource(spec, command, stall_timeout_s=settings.stall_timeout_s)
    if kind == "camera":
        return CameraSource(spec, **camera)
    return FileSource(Path(spec), loop=loop)
