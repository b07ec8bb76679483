"""Tracking evaluation with py-motmetrics (dev only): the demo detector and `ByteTracker` on
seeded `TrafficScene` clips, scored per clip and over all of them.

py-motmetrics 1.4's own IoU helper calls ``np.asfarray`` (gone in NumPy 2), so the distances
come from `pipelines.evaluate.tracking_frame`; the accumulator and the metrics are its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import motmetrics as mm

from pipelines.detector import Detector
from pipelines.evaluate import HELD_OUT_SEED, tracking_frame
from pipelines.tracker import ByteTracker, TrackerSettings
from pipelines.traffic import TrafficScene
from runtimes.registry import load_runtime

METRICS = [
    "idf1",
    "mota",
    "motp",
    "num_switches",
    "num_false_positives",
    "num_misses",
    "num_objects",
    "num_unique_objects",
]


def accumulate(detector: Detector, scene: TrafficScene, frames: int, settings: TrackerSettings) -> Any:
    """A filled ``MOTAccumulator`` for `frames` frames of `scene`."""
    accumulator = mm.MOTAccumulator(auto_id=True)
    tracker = ByteTracker(settings)
    for index in range(frames):
        image, truth = scene.render(index)
        assert truth.ids is not None
        tracked = tracker.update(detector.detect(image)).detections
        frame = tracking_frame(truth.detections, truth.ids, truth.visible < 0.5, tracked)
        accumulator.update(frame.truth_ids, frame.track_ids, frame.distances)
    return accumulator


def evaluate_tracking(
    model: Path, clips: int = 2, frames: int = 300, settings: TrackerSettings | None = None
) -> dict[str, dict[str, float]]:
    """``{clip name or "all": {metric: value}}`` for clips of seeds HELD_OUT_SEED, +1, ..."""
    names, accumulators = [], []
    with load_runtime("onnxruntime", model) as runtime:
        detector = Detector(runtime, conf=0.1)
        for n in range(clips):
            seed = HELD_OUT_SEED + n
            accumulators.append(accumulate(detector, TrafficScene(seed=seed), frames, settings or TrackerSettings()))
            names.append(f"seed {seed}")
    table = mm.metrics.create().compute_many(accumulators, metrics=METRICS, names=names, generate_overall=True)
    rows: dict[str, dict[str, float]] = table.to_dict("index")
    return {("all" if name == "OVERALL" else name): row for name, row in rows.items()}
