"""`DetectionFilter`: which of a model's detections one camera keeps.

A model's raw outputs are decoded per camera, so cameras sharing one loaded model (and one
batched inference, `pipelines.shared_model`) may keep different detections: each camera's
filter is applied after the shared inference, in its own inference thread.

In the order `Detector.postprocess` applies them:

- ``conf``: a candidate is kept when its score is **above** it (a score equal to ``conf`` is
  left out, as the grid decoders and Ultralytics do it);
- ``classes``: only these class ids are kept (None: every class), before NMS and ``max_det``,
  so the classes a camera does not want never take one of its ``max_det`` places, and
  tracking, counting and events never see them;
- ``iou``: class-aware NMS overlap threshold (boxes of one class overlapping more suppress
  the weaker);
- ``max_det``: the most detections kept per frame, highest scores first.

A frozen value: safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from pipelines.decoding.detections import Detections


@dataclass(frozen=True)
class DetectionFilter:
    """`conf` and `iou` in 0..1, `max_det` at least 1, `classes` the class ids kept (None: all;
    an empty set keeps nothing). Raises `ValueError` naming the field and the value."""

    conf: float = 0.25
    iou: float = 0.45
    max_det: int = 300
    classes: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.conf <= 1.0:
            raise ValueError(f"conf must be within 0..1, got {self.conf}")
        if not 0.0 <= self.iou <= 1.0:
            raise ValueError(f"iou must be within 0..1, got {self.iou}")
        if self.max_det < 1:
            raise ValueError(f"max_det must be at least 1, got {self.max_det}")
        if self.classes is not None and any(c < 0 for c in self.classes):
            raise ValueError(f"class ids must be 0 or more, got {sorted(self.classes)}")

    def keep_classes(self, detections: Detections) -> Detections:
        """`detections` of the kept classes only (all of them when `classes` is None)."""
        if self.classes is None:
            return detections
        wanted = np.fromiter(self.classes, np.int64, len(self.classes))
        return detections[np.isin(detections.class_id, wanted)]


#: the defaults of a model's thresholds where its exporter's own are not known
DEFAULTS = DetectionFilter()

#: the thresholds an exporter's own tools use, by the ``author`` its models' metadata names:
#: Ultralytics' predict and val keep scores above 0.25 and suppress at IoU 0.7 (its
#: ``cfg/default.yaml``), so a user comparing with ``yolo predict`` sees the same detections
EXPORTER_DEFAULTS: Mapping[str, DetectionFilter] = {"Ultralytics": DetectionFilter(conf=0.25, iou=0.7)}


def defaults_for(author: str | None) -> DetectionFilter:
    """The thresholds a model whose metadata names `author` as its exporter defaults to: the
    exporter's own where `EXPORTER_DEFAULTS` knows them, else `DEFAULTS`."""
    return EXPORTER_DEFAULTS.get(author or "", DEFAULTS)


def exporter_default(field: str) -> str:
    """`field`'s defaults in words, for a command's help: ``the model's exporter's (Ultralytics
    0.7), else 0.45``."""
    known = ", ".join(f"{author} {getattr(f, field)}" for author, f in EXPORTER_DEFAULTS.items())
    return f"the model's exporter's ({known}), else {getattr(DEFAULTS, field)}"


@dataclass(frozen=True)
class ThresholdChoice:
    """Thresholds asked for (``--conf``, ``--iou``, ``--max-det``); None leaves a value to the
    model's defaults (`defaults_for` its exporter)."""

    conf: float | None = None
    iou: float | None = None
    max_det: int | None = None

    def over(self, defaults: DetectionFilter) -> DetectionFilter:
        """`defaults` with the values asked for in their place (`ValueError` naming a bad one)."""
        return DetectionFilter(
            defaults.conf if self.conf is None else self.conf,
            defaults.iou if self.iou is None else self.iou,
            defaults.max_det if self.max_det is None else self.max_det,
        )
