"""Each camera's detection thresholds: agent.yaml's ``cameras[]`` over the bundle's manifest.

`camera_filter` resolves what one camera keeps of the serving version's detections: its own
``conf``, ``iou`` and ``max_det`` where agent.yaml sets them, the manifest's
(`agent.bundles.manifest.DetectionThresholds`, set by ``bundle build --conf --iou --max-det``)
otherwise, and its ``classes`` (label names) as the version's class ids. A name the version
lacks is a problem in words a technician can act on, located in agent.yaml
(``FILE:LINE: cameras.0.classes.1``): `config check` reports it against the installed
version, and the cameras log it and show it on the status page when the version is activated;
the camera then keeps the classes it names that the version has. `in_force` is what the
snapshot shows. Pure functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.bundles.manifest import Manifest
from agent.config.models import CameraSection
from agent.snapshot import ThresholdsInForce
from pipelines.decoding.detection_filter import DetectionFilter

#: where a key of agent.yaml is: ("cameras", "0", "classes", "1") -> "agent.yaml:12: cameras.0.classes.1"
Locate = Callable[[Sequence[str]], str]

#: the keys of ``cameras[]`` that override the manifest's
KEYS = ("conf", "iou", "max_det", "classes")


def dotted(loc: Sequence[str]) -> str:
    """A locator that knows no file: the key path alone."""
    return ".".join(loc)


@dataclass(frozen=True)
class CameraFilter:
    """One camera's resolved `detection_filter` and the `problems` its configuration has with the version."""

    detection_filter: DetectionFilter
    problems: tuple[str, ...] = ()


def class_problems(index: int, section: CameraSection, manifest: Manifest, locate: Locate = dotted) -> list[str]:
    """A line per name in the `index`-th camera's ``classes`` that `manifest`'s labels lack."""
    more = ", ..." if len(manifest.labels) > 12 else ""
    labels = ", ".join(manifest.labels[:12]) + more
    return [
        f"{locate(('cameras', str(index), 'classes', str(i)))}: {name!r} is not a label of {manifest.name} "
        f"{manifest.version} (its labels: {labels}), so camera {section.name} keeps no detections of it"
        for i, name in section.unknown_classes(manifest.labels)
    ]


def camera_filter(index: int, section: CameraSection, manifest: Manifest, locate: Locate = dotted) -> CameraFilter:
    """What the `index`-th configured camera keeps of `manifest`'s version's detections."""
    bundle = manifest.thresholds
    classes = None
    if section.classes:
        wanted = set(section.classes)
        classes = frozenset(i for i, label in enumerate(manifest.labels) if label in wanted)
    detection_filter = DetectionFilter(
        conf=bundle.conf if section.conf is None else section.conf,
        iou=bundle.iou if section.iou is None else section.iou,
        max_det=bundle.max_det if section.max_det is None else section.max_det,
        classes=classes,
    )
    return CameraFilter(detection_filter, tuple(class_problems(index, section, manifest, locate)))


def in_force(
    section: CameraSection, serving: DetectionFilter, labels: Sequence[str], problems: Sequence[str] = ()
) -> ThresholdsInForce:
    """The snapshot's account of a camera's `serving` filter: class ids as the version's label
    names, which keys agent.yaml set, and the problems found at activation."""
    classes = None
    if serving.classes is not None:
        names = (labels[i] if i < len(labels) else str(i) for i in sorted(serving.classes))
        classes = tuple(dict.fromkeys(names))
    configured = tuple(key for key in KEYS if getattr(section, key) not in (None, []))
    return ThresholdsInForce(
        camera=section.name,
        conf=serving.conf,
        iou=serving.iou,
        max_det=serving.max_det,
        classes=classes,
        configured=configured,
        problems=tuple(problems),
    )
