"""Board recipes: camera source strings for the cameras the boards really have (docs/cameras.md).

``edge-agent config example --source NAME`` writes a recipe's source into the example config;
docs/cameras.md explains each one. Every recipe is a valid ``cameras[].source`` (a test
checks them), and ``edge-agent probe`` / ``config check`` say what a board lacks to run one.
Replace ``CAMERA`` (an RTSP camera's address with its user and password) before use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CameraRecipe:
    """One camera on one kind of board: `name` for the CLI, `board` and `camera` in words, the
    `source` string, and a `note` on what it needs."""

    name: str
    board: str
    camera: str
    source: str
    note: str


RECIPES: tuple[CameraRecipe, ...] = (
    CameraRecipe(
        "pi-camera",
        "Raspberry Pi 5 / 4 (Raspberry Pi OS Bookworm)",
        "a camera module on the CSI connector (libcamera)",
        "rpicam:--width 1280 --height 720 --framerate 15",
        "rpicam-apps; raw YUV420 from rpicam-vid, so the width must be a multiple of 64",
    ),
    CameraRecipe(
        "pi-camera-gst",
        "Raspberry Pi 5 / 4",
        "a camera module through libcamera's GStreamer element",
        "gst:libcamerasrc ! video/x-raw,width=1280,height=720,framerate=15/1,format=NV12",
        "gstreamer1.0-libcamera",
    ),
    CameraRecipe(
        "jetson-csi",
        "Jetson (JetPack 5 / 6)",
        "a CSI camera through Argus (IMX219, IMX477, ...)",
        "gst:nvarguscamerasrc sensor-id=0 ! video/x-raw(memory:NVMM),width=1920,height=1080,framerate=30/1"
        " ! nvvidconv ! video/x-raw,width=1280,height=720,format=I420",
        "JetPack's GStreamer plugins; nvvidconv scales on the VIC and copies to system memory",
    ),
    CameraRecipe(
        "jetson-rtsp",
        "Jetson",
        "an H.264 RTSP camera, decoded by NVDEC",
        "gst:rtspsrc location=rtsp://CAMERA/stream latency=200 ! rtph264depay ! h264parse ! nvv4l2decoder"
        " ! nvvidconv ! video/x-raw,format=I420",
        "JetPack's GStreamer plugins (H.265 cameras: rtph265depay ! h265parse)",
    ),
    CameraRecipe(
        "pi4-rtsp",
        "Raspberry Pi 4",
        "an H.264 RTSP camera, decoded by the Pi 4's hardware decoder",
        "gst:rtspsrc location=rtsp://CAMERA/stream latency=200 ! rtph264depay ! h264parse ! v4l2h264dec",
        "gstreamer1.0-plugins-good; the Pi 5 has no H.264 decoder block: use the rtsp recipe there",
    ),
    CameraRecipe(
        "rtsp",
        "any board",
        "an RTSP camera through ffmpeg, with the board's hardware decoder (cameras.ffmpeg.hwaccel: auto)",
        "ffmpeg:rtsp://CAMERA/stream",
        "ffmpeg; Jetson h264_nvv4l2dec (NVIDIA's ffmpeg) or h264_nvmpi, Pi 4 h264_v4l2m2m, else software",
    ),
    CameraRecipe(
        "usb-mjpeg",
        "any board",
        "a USB (UVC) camera sending MJPEG, through ffmpeg's V4L2 input",
        "ffmpeg:-f v4l2 -input_format mjpeg -video_size 1280x720 -framerate 30 /dev/video0",
        "ffmpeg; the user in the video group; v4l2-ctl --list-formats-ext lists the camera's modes",
    ),
    CameraRecipe(
        "jetson-usb-mjpeg",
        "Jetson",
        "a USB camera sending MJPEG, decoded by the Jetson's JPEG engine",
        "gst:v4l2src device=/dev/video0 ! image/jpeg,width=1280,height=720,framerate=30/1"
        " ! nvv4l2decoder mjpeg=1 ! nvvidconv ! video/x-raw,format=I420",
        "JetPack's GStreamer plugins",
    ),
    CameraRecipe(
        "usb",
        "any board",
        "a USB camera through OpenCV's V4L2 backend (needs no GStreamer)",
        "/dev/video0",
        "set width, height and fps in the pipeline section",
    ),
)

RECIPE_NAMES: tuple[str, ...] = tuple(recipe.name for recipe in RECIPES)


def recipe(name: str) -> CameraRecipe | None:
    """The recipe called `name`, or None."""
    return next((r for r in RECIPES if r.name == name), None)
