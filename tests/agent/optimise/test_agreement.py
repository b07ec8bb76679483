"""`agent.optimise.agreement`: a model agrees with itself completely."""

from __future__ import annotations

import numpy as np
import pytest
from testkit.optimise import FP32

from agent.optimise.agreement import measure
from pipelines.decoding.detector import Detector
from pipelines.sources.synthetic import SyntheticScene
from runtimes.registry import load_runtime


def test_agreement_of_a_model_with_itself_is_complete_and_errors_are_zero() -> None:
    frames = [SyntheticScene(seed=7_100 + i, num_shapes=4).render(3)[0] for i in range(3)]
    with load_runtime("onnxruntime", FP32) as one, load_runtime("onnxruntime", FP32) as two:
        measured = measure(Detector(one), Detector(two), frames)
        assert measured.agreement == 1.0 and measured.extra == 0 and measured.max_abs_error == 0.0
        assert measured.baseline_detections >= 3
        with pytest.raises(ValueError, match="at least one validation image"):
            measure(Detector(one), Detector(two), [])
        blank = [np.zeros((480, 640, 3), np.uint8)]
        assert measure(Detector(one), Detector(two), blank).agreement is None  # nothing to compare
