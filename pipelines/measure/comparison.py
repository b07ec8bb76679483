"""How far a candidate model agrees with the serving one on the same frames (no ground truth).

The serving model's detections stand in for the truth: a candidate detection that overlaps a
serving detection of the same class at IoU >= `iou` (axis-aligned boxes, every task has them)
is matched, greedily, the candidate's most confident first (`pipelines.measure.evaluate.match`,
as against ground truth). From the counts:

- `precision`: matched / the candidate's detections; `recall`: matched / the serving model's;
- `agreement`: their harmonic mean (F1), 1.0 when neither found anything;
- `confident_ratio`: the candidate's detections at or above `confident` over the serving
  model's (a candidate whose scores collapsed finds the same boxes, less sure);
- per class the same numbers (by class id), so a swapped pair of classes shows even where the
  whole frame agrees;
- for task models, over matched pairs, the task's own measure in 0..1 (`task_score`): mean
  mask IoU (segmentation), the share of keypoints within a tenth of the box diagonal of each
  other (pose), mean probabilistic IoU of the oriented boxes (obb);
- the latency of each model per frame (median, ms) where the caller timed them;
- where both versions have a second stage (a classifier of the detections' crops), `top1`: the
  share of crops both classifiers gave the same top-1 label (`add_crops`, fed by
  `pipelines.measure.second_stage`).

`Agreement` accumulates frames (one caller thread; the shadow and ``bench --against`` each own
one per camera); `report()` is a frozen `AgreementReport`. Pure: no clock, no I/O.
`compare_frame` is the one step of both on a frame: it runs the two detectors on it, times
each with the clock it is given, and adds the frame.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detection_filter import DetectionFilter
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.decoding.rotated import probiou
from pipelines.detection_rates import CONFIDENT
from pipelines.measure.evaluate import match

Task = Literal["masks", "keypoints", "oriented"]
#: matched keypoints closer than this fraction of the serving box's diagonal count as the same
KEYPOINT_TOLERANCE = 0.1
#: frames of latency kept for the medians (the newest)
LATENCY_SAMPLES = 512


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 1.0


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


@dataclass(frozen=True)
class ClassAgreement:
    """One class over the frames compared: detections of each model, matched pairs, the
    confident ones of each, and the candidate's mean confidence on its detections."""

    class_id: int
    serving: int
    candidate: int
    matched: int
    serving_confident: int
    candidate_confident: int

    @property
    def precision(self) -> float:
        return _ratio(self.matched, self.candidate)

    @property
    def recall(self) -> float:
        return _ratio(self.matched, self.serving)

    @property
    def agreement(self) -> float:
        return 1.0 if not self.serving and not self.candidate else _f1(self.precision, self.recall)

    @property
    def confident_ratio(self) -> float | None:
        """The candidate's confident detections over the serving model's; None when the serving
        model had none."""
        return self.candidate_confident / self.serving_confident if self.serving_confident else None


@dataclass(frozen=True)
class AgreementReport:
    """The comparison over `frames` frames: totals, per class (by class id, those either model
    found), the task measure (None for a box detector or without matched pairs) and medians of
    each model's latency per frame in ms (None where untimed)."""

    frames: int
    classes: tuple[ClassAgreement, ...]
    task: Task | None = None
    task_score: float | None = None
    serving_ms: float | None = None
    candidate_ms: float | None = None
    crops: int = 0
    crops_agreeing: int = 0

    @property
    def top1(self) -> float | None:
        """The share of crops both second stages named alike (None: no crop classified)."""
        return self.crops_agreeing / self.crops if self.crops else None

    @property
    def serving(self) -> int:
        return sum(c.serving for c in self.classes)

    @property
    def candidate(self) -> int:
        return sum(c.candidate for c in self.classes)

    @property
    def matched(self) -> int:
        return sum(c.matched for c in self.classes)

    @property
    def precision(self) -> float:
        return _ratio(self.matched, self.candidate)

    @property
    def recall(self) -> float:
        return _ratio(self.matched, self.serving)

    @property
    def agreement(self) -> float:
        """F1 of the candidate against the serving model; 1.0 when neither found anything."""
        return 1.0 if not self.serving and not self.candidate else _f1(self.precision, self.recall)

    @property
    def confident_ratio(self) -> float | None:
        serving = sum(c.serving_confident for c in self.classes)
        return sum(c.candidate_confident for c in self.classes) / serving if serving else None

    def of_class(self, class_id: int) -> ClassAgreement | None:
        return next((c for c in self.classes if c.class_id == class_id), None)


@dataclass
class _Counts:
    serving: int = 0
    candidate: int = 0
    matched: int = 0
    serving_confident: int = 0
    candidate_confident: int = 0


@dataclass
class Agreement:
    """Accumulates the comparison frame by frame (one thread). `iou`: the overlap that matches
    two boxes; `confident`: the confidence from which a detection counts as confident."""

    iou: float = 0.5
    confident: float = CONFIDENT
    frames: int = 0
    _classes: dict[int, _Counts] = field(default_factory=dict)
    _task: Task | None = None
    _task_sum: float = 0.0
    _task_pairs: int = 0
    _serving_ms: list[float] = field(default_factory=list)
    _candidate_ms: list[float] = field(default_factory=list)
    _crops: int = 0
    _crops_agreeing: int = 0

    def add_crops(self, same: Sequence[bool]) -> None:
        """One frame's crops classified by both second stages: whether each got the same top-1."""
        self._crops += len(same)
        self._crops_agreeing += sum(same)

    def add(
        self,
        serving: Detections,
        candidate: Detections,
        serving_ms: float | None = None,
        candidate_ms: float | None = None,
    ) -> None:
        """Compare one frame's detections of both models (in the same frame's pixels)."""
        self.frames += 1
        for ms, samples in ((serving_ms, self._serving_ms), (candidate_ms, self._candidate_ms)):
            if ms is not None:
                samples.append(ms)
                del samples[:-LATENCY_SAMPLES]
        for detections, side in ((serving, "serving"), (candidate, "candidate")):
            for class_id, confidence in zip(detections.class_id.tolist(), detections.confidence.tolist(), strict=True):
                counts = self._classes.setdefault(int(class_id), _Counts())
                setattr(counts, side, getattr(counts, side) + 1)
                if confidence >= self.confident:
                    name = f"{side}_confident"
                    setattr(counts, name, getattr(counts, name) + 1)
        for j, i in match(candidate, serving, self.iou):
            self._classes[int(serving.class_id[i])].matched += 1
            self._score_task(serving, candidate, i, j)

    def _score_task(self, serving: Detections, candidate: Detections, i: int, j: int) -> None:
        score: float | None = None
        if serving.masks is not None and candidate.masks is not None:
            self._task = "masks"
            a, b = serving.masks.bitmap(i), candidate.masks.bitmap(j)
            union = np.logical_or(a, b).sum()
            score = float(np.logical_and(a, b).sum() / union) if union else 1.0
        elif serving.keypoints is not None and candidate.keypoints is not None:
            self._task = "keypoints"
            score = _keypoint_share(serving.keypoints[i], candidate.keypoints[j], serving.xyxy[i])
        elif serving.xywhr is not None and candidate.xywhr is not None:
            self._task = "oriented"
            score = float(probiou(serving.xywhr[i : i + 1], candidate.xywhr[j : j + 1])[0, 0])
        if score is not None:
            self._task_sum += score
            self._task_pairs += 1

    def report(self) -> AgreementReport:
        classes = tuple(
            ClassAgreement(class_id, c.serving, c.candidate, c.matched, c.serving_confident, c.candidate_confident)
            for class_id, c in sorted(self._classes.items())
        )
        return AgreementReport(
            frames=self.frames,
            classes=classes,
            task=self._task,
            task_score=self._task_sum / self._task_pairs if self._task_pairs else None,
            serving_ms=statistics.median(self._serving_ms) if self._serving_ms else None,
            candidate_ms=statistics.median(self._candidate_ms) if self._candidate_ms else None,
            crops=self._crops,
            crops_agreeing=self._crops_agreeing,
        )


def _keypoint_share(
    serving: npt.NDArray[np.float32], candidate: npt.NDArray[np.float32], box: npt.NDArray[np.float32]
) -> float:
    """The share of keypoints (``(K, 2 or 3)`` each) within `KEYPOINT_TOLERANCE` of the serving
    box's diagonal of each other; keypoints the serving model scored below 0.5 are left out."""
    visible = serving[:, 2] >= 0.5 if serving.shape[1] == 3 else np.ones(len(serving), bool)
    if not visible.any():
        return 1.0
    diagonal = float(np.hypot(box[2] - box[0], box[3] - box[1])) or 1.0
    distance = np.hypot(*(serving[visible, :2] - candidate[visible, :2]).T)
    return float(np.mean(distance <= KEYPOINT_TOLERANCE * diagonal))


def compare_frame(
    agreement: Agreement,
    image: npt.NDArray[np.uint8],
    serving: Detector,
    candidate: Detector,
    detection_filter: DetectionFilter | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Detections, Detections]:
    """Compare the two models on one BGR ``(H, W, 3) uint8`` frame: run `serving`, then
    `candidate` (`Detector.detect`: preprocessing, inference, decoding and NMS), time each with
    `clock` (seconds; the latency recorded is ms per frame), add the frame to `agreement` and
    return both detections (frame pixels). `detection_filter` is what a camera keeps (its
    classes, thresholds) applied to both; None: each model's own (its manifest's thresholds).

    The step the daemon's shadow and ``edge-agent bench --against`` share, so the same frames
    give the same numbers: call it from the thread that owns `agreement`. A `DecoderError` of
    either model is the caller's to count (nothing is added then).
    """
    start = clock()
    expected = serving.detect(image, detection_filter)
    middle = clock()
    found = candidate.detect(image, detection_filter)
    end = clock()
    agreement.add(expected, found, (middle - start) * 1000, (end - middle) * 1000)
    return expected, found
