"""How close a runtime's answers are to a reference: raw outputs and detections.

- `parity_fraction`: the fraction of output values within ``atol + rtol * |expected|`` (the
  bundle's parity check on activation);
- `max_abs_error`: the largest absolute difference of the raw outputs, dequantized;
- `detection_agreement`: reference boxes matched by a box of the same label at IoU >= 0.5,
  as a fraction of the larger of the two detection counts (so missed and extra boxes both
  lower it); 1.0 when both found nothing.

Pure functions of arrays; used by activation (`agent.bundles.installer`) and the optimisation
report (`pipelines.measure.matrix`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections
from pipelines.measure.evaluate import MatchCounts
from runtimes.base import TensorSpec, dequantize


def parity_fraction(
    outputs: Sequence[npt.NDArray[Any]],
    expected: Sequence[npt.NDArray[Any]],
    specs: Sequence[TensorSpec],
    atol: float,
    rtol: float,
) -> float:
    """Fraction of output values within ``atol + rtol * |expected|``, compared dequantized."""
    within = total = 0
    for got, want, spec in zip(outputs, expected, specs, strict=True):
        if got.shape != want.shape:
            return 0.0
        a, b = dequantize(got, spec), dequantize(want, spec)
        within += int(np.count_nonzero(np.abs(a - b) <= atol + rtol * np.abs(b)))
        total += b.size
    return within / total if total else 1.0


def max_abs_error(
    outputs: Sequence[npt.NDArray[Any]], expected: Sequence[npt.NDArray[Any]], specs: Sequence[TensorSpec]
) -> float | None:
    """The largest absolute difference over all outputs, dequantized; None when the shapes differ."""
    if len(outputs) != len(expected) or any(a.shape != b.shape for a, b in zip(outputs, expected, strict=True)):
        return None
    worst = 0.0
    for got, want, spec in zip(outputs, expected, specs, strict=True):
        if got.size:
            worst = max(worst, float(np.max(np.abs(dequantize(got, spec) - dequantize(want, spec)))))
    return worst


def detection_agreement(found: Detections, reference: Detections, iou_threshold: float = 0.5) -> float:
    """Matched boxes (same label, IoU >= `iou_threshold`) over the larger detection count."""
    if len(found) == 0 and len(reference) == 0:
        return 1.0
    counts = MatchCounts()
    counts.add(found, reference, iou_threshold=iou_threshold)
    return counts.true_positives / max(len(found), len(reference))
