"""`pipelines.sources.specs`: source strings to sources."""

from __future__ import annotations

import pytest

from pipelines.sources.capture import CameraSource, FileSource
from pipelines.sources.scene_source import SyntheticSource
from pipelines.sources.specs import open_source
from pipelines.sources.synthetic import SyntheticScene
from pipelines.sources.tracking_scene import TrackingScene


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("synthetic", SyntheticSource),
        ("synthetic:4", SyntheticSource),
        ("clip.mp4", FileSource),
        ("/dev/video0", CameraSource),
        ("0", CameraSource),
        ("rtsp://cam/1", CameraSource),
        ("nvarguscamerasrc ! nvvidconv ! appsink", CameraSource),
    ],
)
def test_open_source_dispatch(spec: str, kind: type) -> None:
    assert isinstance(open_source(spec), kind)


@pytest.mark.parametrize(
    ("spec", "scene", "name"),
    [
        ("synthetic:3", SyntheticScene, "synthetic:seed=3"),
        ("tracking:3", TrackingScene, "tracking:seed=3"),
        ("traffic:3", TrackingScene, "tracking:seed=3"),  # the tracking scene's older name
    ],
)
def test_scene_sources_by_name(spec: str, scene: type, name: str) -> None:
    source = open_source(spec)
    assert isinstance(source, SyntheticSource)
    assert type(source.scene) is scene and source.scene.seed == 3 and source.name == name


@pytest.mark.parametrize("spec", ["synthetic:2"])
def test_the_synthetic_scene_takes_the_cameras_width_and_height(spec: str) -> None:
    """A synthetic camera at 1920x1080 renders 1920x1080 (memory benchmarks per resolution)."""
    source = open_source(spec, width=1920, height=1080, fps=5)
    frame = source.read()
    assert frame is not None and frame.image.shape == (1080, 1920, 3)
    source.close()
    default = open_source(spec).read()
    assert default is not None and default.image.shape == (480, 640, 3), "no size given: the scene's own"
