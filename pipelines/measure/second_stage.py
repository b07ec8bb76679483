"""Both versions' second stages on the same crops: does the candidate's classifier name what the
serving one names? (`pipelines.measure.comparison`'s ``top1``, docs/quality.md)

`SecondStages` holds the two classifiers with their labels and the serving detector's class ids
whose crops both classify (both stages' ``for``). `top1_same` cuts the crops of a frame's
serving detections of those classes (the most confident first, at most `max_crops`), classifies
each with both and answers, per crop, whether the two top-1 labels are the same. Labels, not
ids, are compared: a candidate whose label order slipped disagrees even where its network is
the serving one's. Pure apart from the two classifiers' inference; one thread at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pipelines.decoding.classifier import Classifier
from pipelines.decoding.detections import Detections
from pipelines.tracking.analytics import crop_box

#: crops of one frame classified by both, at most (each costs two classifications)
MAX_CROPS = 4


@dataclass(frozen=True)
class SecondStages:
    """The serving and candidate classifiers, each with its labels (index = class id), and
    `classes`: the serving detector's class ids whose crops both classify."""

    serving: Classifier
    serving_labels: tuple[str, ...]
    candidate: Classifier
    candidate_labels: tuple[str, ...]
    classes: frozenset[int]
    max_crops: int = MAX_CROPS

    @classmethod
    def of(
        cls,
        serving: tuple[Classifier, Sequence[str], Sequence[str]],
        candidate: tuple[Classifier, Sequence[str], Sequence[str]],
        detector_labels: Sequence[str],
    ) -> SecondStages:
        """From each side's (classifier, its labels, the detector labels it is for: empty for
        all) and the serving detector's labels."""
        wanted = [set(for_labels) or set(detector_labels) for _, _, for_labels in (serving, candidate)]
        classes = frozenset(i for i, name in enumerate(detector_labels) if all(name in w for w in wanted))
        return cls(serving[0], tuple(serving[1]), candidate[0], tuple(candidate[1]), classes)

    def close(self) -> None:
        """Close both classifiers' runtimes."""
        self.serving.runtime.close()
        self.candidate.runtime.close()


def _top1(classifier: Classifier, labels: tuple[str, ...], crop: npt.NDArray[np.uint8]) -> str:
    class_id = classifier.classify(crop).top(1)[0][0]
    return labels[class_id] if class_id < len(labels) else f"class {class_id}"


def top1_same(image: npt.NDArray[np.uint8], serving: Detections, stages: SecondStages) -> list[bool]:
    """For each crop of `serving`'s detections (frame pixels) of `stages.classes` on the BGR
    ``(H, W, 3) uint8`` `image`, most confident first, at most `stages.max_crops`: whether both
    classifiers' top-1 labels are the same. Empty crops (a box outside the image) are skipped."""
    order = np.argsort(-serving.confidence, kind="stable")
    same: list[bool] = []
    for i in order.tolist():
        if len(same) >= stages.max_crops:
            break
        if int(serving.class_id[i]) not in stages.classes:
            continue
        crop = crop_box(image, serving.xyxy[i])
        if crop.size == 0:
            continue
        same.append(
            _top1(stages.serving, stages.serving_labels, crop) == _top1(stages.candidate, stages.candidate_labels, crop)
        )
    return same
