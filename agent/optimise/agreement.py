"""Proof before shipping: how closely a variant answers like the FP32 model it came from.

`measure` runs both detectors on the same validation images, each image preprocessed the way
the pipeline does (`Detector.prepare`), and compares

- the raw outputs (dequantized to float32): largest and mean absolute difference;
- the detections after decoding and NMS: the FP32 detections are the ground truth, a variant's
  detection matches one of the same label at IoU >= 0.5 (greedy, highest confidence first:
  `pipelines.measure.evaluate.MatchCounts`); agreement = matched / FP32 detections.

Pure computation over loaded detectors, in the calling thread; no ONNX tooling needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.bundles.manifest import Agreement
from pipelines.decoding.detector import Detector
from pipelines.measure.evaluate import MatchCounts

#: IoU at which a variant's box matches an FP32 box of the same label
MATCH_IOU = 0.5


@dataclass(frozen=True)
class Measured:
    """A variant against the FP32 model over `images` validation images."""

    images: int
    baseline_detections: int  # FP32 detections, all images
    matched: int  # of those, found by the variant too
    extra: int  # the variant's detections that match none
    max_abs_error: float  # raw outputs, over every value of every image
    mean_abs_error: float

    @property
    def agreement(self) -> float | None:
        """matched / FP32 detections (0..1); None when the FP32 model found nothing to compare."""
        return self.matched / self.baseline_detections if self.baseline_detections else None

    def to_manifest(self, baseline: str, min_agreement: float) -> Agreement:
        """The manifest's record; only for a measurement with FP32 detections."""
        if self.agreement is None:
            raise ValueError("no FP32 detections: nothing was measured")
        return Agreement(
            baseline=baseline,
            images=self.images,
            iou=MATCH_IOU,
            detections=round(self.agreement, 4),
            baseline_detections=self.baseline_detections,
            matched=self.matched,
            extra=self.extra,
            max_abs_error=self.max_abs_error,
            mean_abs_error=self.mean_abs_error,
            min_agreement=min_agreement,
        )


def measure(baseline: Detector, variant: Detector, images: Sequence[npt.NDArray[Any]]) -> Measured:
    """Compare `variant` with `baseline` on BGR ``(H, W, 3) uint8`` `images`.

    Raises ``ValueError`` when their raw outputs differ in number or shape (not a variant of the
    same model), and `pipelines.decoding.decoders.DecoderError` when the plausibility guard finds the
    variant's detections impossible.
    """
    if not images:
        raise ValueError("agreement needs at least one validation image")
    counts = MatchCounts()
    worst, total, values = 0.0, 0.0, 0
    for image in images:
        tensor, transform = baseline.prepare(image)
        expected = baseline.infer(tensor)
        variant_tensor, variant_transform = variant.prepare(image)
        got = variant.infer(variant_tensor)
        shapes = [a.shape for a in expected], [b.shape for b in got]
        if shapes[0] != shapes[1]:
            raise ValueError(f"outputs {shapes[1]} differ in shape from the FP32 model's {shapes[0]}")
        for a, b in zip(expected, got, strict=True):
            difference = np.abs(a.astype(np.float64) - b.astype(np.float64))
            worst = max(worst, float(difference.max(initial=0.0)))
            total += float(difference.sum())
            values += difference.size
        truth = baseline.postprocess(expected, transform)
        counts.add(variant.postprocess(got, variant_transform), truth, iou_threshold=MATCH_IOU)
    return Measured(
        images=len(images),
        baseline_detections=counts.true_positives + counts.false_negatives,
        matched=counts.true_positives,
        extra=counts.false_positives,
        max_abs_error=round(worst, 6),
        mean_abs_error=round(total / values, 6) if values else 0.0,
    )
