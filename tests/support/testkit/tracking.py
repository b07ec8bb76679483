"""Tracking evaluation with py-motmetrics (dev only): the demo detector and `ByteTracker` on
seeded `TrackingScene` clips, scored per clip and over all of them.

py-motmetrics 1.4's own IoU helper calls ``np.asfarray`` (gone in NumPy 2), so the distances
come from `pipelines.measure.evaluate.tracking_frame`; the accumulator and the metrics are its own.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import motmetrics as mm

from pipelines.decoding.detector import Detector
from pipelines.measure.evaluate import HELD_OUT_SEED, tracking_frame
from pipelines.sources.tracking_scene import Mover, TrackingScene
from pipelines.tracking.tracker import ByteTracker, TrackerSettings
from pipelines.tracking.zones import LineSpec
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


def accumulate(detector: Detector, scene: TrackingScene, frames: int, settings: TrackerSettings) -> Any:
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
            accumulators.append(accumulate(detector, TrackingScene(seed=seed), frames, settings or TrackerSettings()))
            names.append(f"seed {seed}")
    table = mm.metrics.create().compute_many(accumulators, metrics=METRICS, names=names, generate_overall=True)
    rows: dict[str, dict[str, float]] = table.to_dict("index")
    return {("all" if name == "OVERALL" else name): row for name, row in rows.items()}


FPS = 15.0


LINE = LineSpec("road", (40.0, 240.0), (600.0, 240.0))  # left to right: forward is moving down


COLORS = [(40, 40, 220), (220, 90, 30), (30, 200, 60), (200, 40, 200), (20, 190, 220)]


MOVERS = [
    Mover(1, 0, 60, 0, 70, (150, 60), (0, 6), COLORS[0]),  # down
    Mover(2, 1, 80, 10, 90, (300, 440), (0, -5), COLORS[1]),  # up
    Mover(3, 2, 60, 40, 120, (450, 50), (0.5, 5), COLORS[2]),  # down
    Mover(4, 1, 70, 82, 129, (30, 240), (5, 0.05), COLORS[3]),  # along the line, after the others crossed
    Mover(5, 0, 50, 20, 100, (620, 420), (0, -5), COLORS[4]),  # up, beyond the line's end
]  # two shapes cross the line downward, one upward, one moves along it, one passes beyond its end


def true_crossings(movers: list[Mover], frames: int, line: LineSpec) -> dict[tuple[int, str], int]:
    """Crossings of a horizontal `line` by each mover's exact centre: {(class, direction): n}."""
    counts: dict[tuple[int, str], int] = {}
    y, (x_low, x_high) = line.start[1], sorted((line.start[0], line.end[0]))
    for mover in movers:
        path = [mover.centre(i) for i in range(mover.first, min(mover.last, frames - 1) + 1)]
        for (_, y0), (x1, y1) in itertools.pairwise(path):
            if (y0 < y) != (y1 < y) and x_low <= x1 <= x_high:
                key = (mover.kind, "forward" if y1 > y0 else "backward")
                counts[key] = counts.get(key, 0) + 1
    return counts
