"""A camera's drift score (`pipelines.drift`) on synthetic detection streams and an injected clock."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines.drift import (
    AREA_BINS,
    CONF_BINS,
    GAP_CAP_S,
    MAX_LABELS,
    OTHER,
    Baseline,
    DriftTracker,
    Summary,
    compare,
    js_distance,
    rate_distance,
)

#: the default threshold (agent.config.models.DriftSection)
THRESHOLD = 0.3


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def scene(labels: tuple[str, ...], frames: int, seed: int) -> list[tuple[list[str], np.ndarray, np.ndarray]]:
    """A clip as its detections: per frame one to four objects of `labels` (drawn at random),
    scores around 0.7, boxes of 0.3 to 3 % of the frame."""
    rng = np.random.default_rng(seed)
    clip = []
    for _ in range(frames):
        n = int(rng.integers(1, 5))
        clip.append(
            (
                [labels[int(i)] for i in rng.integers(0, len(labels), n)],
                np.clip(rng.normal(0.7, 0.1, n), 0, 1).astype(np.float32),
                10 ** rng.uniform(-2.5, -1.5, n),
            )
        )
    return clip


def play(tracker: DriftTracker, clock: Clock, clip: list[tuple[list[str], np.ndarray, np.ndarray]]) -> None:
    for labels, scores, shares in clip:
        clock.now += 1.0
        tracker.add(labels, scores, shares)


def tracker(clock: Clock, baseline_s: float = 600.0, window_s: float = 600.0) -> DriftTracker:
    return DriftTracker(Baseline("v1"), baseline_s, window_s, clock)


def test_a_class_mix_that_changes_halfway_scores_past_the_threshold() -> None:
    clock = Clock()
    drift = tracker(clock)
    play(drift, clock, scene(("person", "person", "person", "car"), 600, seed=1))  # the baseline: mostly people
    play(drift, clock, scene(("car", "car", "car", "person"), 600, seed=2))  # then mostly cars
    found = drift.report()
    assert found is not None
    assert found.score > THRESHOLD, found  # bug: the class mix left out of the score
    assert found.classes == found.score and found.confidence < 0.1 and found.area < 0.1
    assert found.changed.startswith("class mix: ") and "of detections" in found.changed


def test_the_same_clip_repeated_stays_under_the_threshold() -> None:
    clock = Clock()
    drift = tracker(clock)
    clip = scene(("person", "car", "dog"), 600, seed=3)
    play(drift, clock, clip)
    play(drift, clock, clip)
    found = drift.report()
    assert found is not None
    assert found.score < THRESHOLD / 3, found  # bug: tallies compared by count, not share; a part never 0


def test_no_score_while_the_baseline_is_captured_or_the_window_is_short() -> None:
    clock = Clock()
    drift = tracker(clock, baseline_s=600.0, window_s=1200.0)
    play(drift, clock, scene(("person",), 600, seed=4))  # 599 seconds: the first frame follows none
    assert not drift.baseline.complete and drift.report() is None
    play(drift, clock, scene(("person",), 1, seed=4))
    assert drift.baseline.complete, "600 seconds covered complete a 600-second baseline"
    assert drift.report() is not None, "the window covered 600 of 1200 seconds: half is enough"


def test_a_complete_baseline_no_longer_changes() -> None:
    clock = Clock()
    drift = tracker(clock, baseline_s=100.0)
    play(drift, clock, scene(("person",), 101, seed=5))
    frozen = drift.baseline.to_json()
    play(drift, clock, scene(("car",), 50, seed=6))
    assert drift.baseline.to_json() == frozen


def test_a_gap_counts_only_up_to_its_cap() -> None:
    """A restart, a pause or a stopped camera is not time watched: the baseline would end early."""
    clock = Clock()
    drift = tracker(clock, baseline_s=3600.0)
    play(drift, clock, scene(("person",), 10, seed=7))
    clock.now += 3 * 3600  # the camera was off
    drift.add(["person"], np.array([0.8], np.float32), np.array([0.01]))
    assert drift.baseline.summary.seconds == pytest.approx(9.0 + GAP_CAP_S)
    assert not drift.baseline.complete


def test_the_window_forgets_what_is_older_than_its_length() -> None:
    clock = Clock()
    drift = tracker(clock, baseline_s=10.0, window_s=100.0)
    play(drift, clock, scene(("person",), 50, seed=8))
    clock.now += 200
    play(drift, clock, scene(("car",), 60, seed=9))
    current = drift.current()
    assert set(current.classes) == {"car"}, "the people are more than 100 seconds old"


@pytest.mark.parametrize(
    ("p", "q", "expected"),
    [
        ({"a": 3, "b": 1}, {"a": 3, "b": 1}, 0.0),
        ({"a": 6, "b": 2}, {"b": 1, "a": 3}, 0.0),  # by key, not position; by share, not count
        ({"a": 1}, {"b": 1}, 1.0),
        ({}, {}, 0.0),
        ({"a": 1}, {}, 1.0),
        ([1, 0, 0], [0, 0, 1], 1.0),
        ([1, 1], [1, 0], 0.5579),  # sqrt(1 - 0.75 * log2(4 / 3) - ...): half the mass moved
    ],
)
def test_js_distance(p: dict[str, int] | list[int], q: dict[str, int] | list[int], expected: float) -> None:
    assert js_distance(p, q) == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize(("a", "b", "expected"), [(10, 10, 0.0), (10, 5, 0.5), (5, 10, 0.5), (3, 0, 1.0), (0, 0, 0.0)])
def test_rate_distance(a: float, b: float, expected: float) -> None:
    assert rate_distance(a, b) == expected


def test_a_camera_that_went_silent_scores_on_every_part() -> None:
    before = Summary()
    before.add(["person"] * 4, np.full(4, 0.8, np.float32), np.full(4, 0.01), 30.0)
    silent = Summary()
    silent.add([], np.zeros(0, np.float32), np.zeros(0), 30.0)
    found = compare(before, silent)
    assert found.score == 1.0 and found.rate == 0.5 and found.changed.startswith("class mix")


def test_bins_of_scores_and_sizes_at_their_edges() -> None:
    summary = Summary()
    summary.add(["a"] * 4, np.array([0.0, 0.0999, 0.1, 1.0], np.float32), np.array([1e-9, 1e-4, 0.5, 1.0]), 0.0)
    assert summary.confidence == [2, 1, 0, 0, 0, 0, 0, 0, 0, 1]  # 1.0 in the last bin, not past it
    assert summary.area == [2, 0, 0, 0, 0, 0, 0, 2]  # below 1e-4 in the first bin, 0.5 and 1.0 in the last


def test_labels_are_capped() -> None:
    summary = Summary()
    labels = [f"class{i}" for i in range(MAX_LABELS + 10)]
    summary.add(labels, np.full(len(labels), 0.5, np.float32), np.full(len(labels), 0.01), 1.0)
    assert len(summary.classes) == MAX_LABELS + 1 and summary.classes[OTHER] == 10
    assert len(json.dumps(summary.to_json())) < 2000


def test_a_baseline_round_trips_through_json() -> None:
    clock = Clock()
    drift = tracker(clock, baseline_s=20.0)
    play(drift, clock, scene(("person", "car"), 30, seed=10))
    again = Baseline.from_json(json.loads(json.dumps(drift.baseline.to_json())))
    assert again == drift.baseline and again.complete


GOOD = Baseline("v1", Summary({"a": 1}, [0] * CONF_BINS, [0] * AREA_BINS, 1, 1, 1.0)).to_json()


@pytest.mark.parametrize(
    "junk",
    [
        [],
        {**GOOD, "version": ""},
        {**GOOD, "complete": "yes"},
        {**GOOD, "summary": {**GOOD["summary"], "confidence": [0] * (CONF_BINS + 1)}},
        {**GOOD, "summary": {**GOOD["summary"], "area": [-1] * AREA_BINS}},
        {**GOOD, "summary": {**GOOD["summary"], "classes": {"a": True}}},
        {**GOOD, "summary": {**GOOD["summary"], "classes": {f"c{i}": 1 for i in range(MAX_LABELS + 2)}}},
        {**GOOD, "summary": {**GOOD["summary"], "seconds": "1"}},
        {**GOOD, "summary": {**GOOD["summary"], "frames": 1.5}},
    ],
)
def test_a_document_that_is_not_a_baseline_is_refused(junk: object) -> None:
    with pytest.raises(ValueError):
        Baseline.from_json(junk)


# -- the demo model on rendered clips (ONNX Runtime) -----------------------------------------------------


def _clip_detections(seed: int, frames: int) -> list[tuple[list[str], np.ndarray, np.ndarray]]:
    """The demo detector's detections on `frames` frames of the synthetic scene of `seed` (six shapes)."""
    from testkit import DEMO_MODELS

    from pipelines.decoding.detector import Detector
    from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene
    from runtimes.registry import load_runtime

    scene = SyntheticScene(seed=seed, num_shapes=6)
    clip = []
    with load_runtime("onnxruntime", DEMO_MODELS / "demo_detector.onnx") as runtime:
        detector = Detector(runtime)
        for index in range(frames):
            image, _ = scene.render(index)
            found = detector.detect(image)
            wh = found.xyxy[:, 2:] - found.xyxy[:, :2]
            shares = wh[:, 0] * wh[:, 1] / (image.shape[0] * image.shape[1])
            clip.append(([CLASS_NAMES[c] for c in found.class_id.tolist()], found.confidence, shares))
    return clip


@pytest.mark.slow  # 180 inferences: several CPU-seconds
def test_the_demo_model_on_a_clip_whose_shapes_change_halfway_and_on_one_repeated() -> None:
    """Seed 11 holds circles and squares, seed 8 circles and triangles (the same number of
    shapes): played one after the other the class mix turns; seed 11 played twice does not."""
    first, second = _clip_detections(11, 90), _clip_detections(8, 90)
    clock = Clock()
    changed = tracker(clock, baseline_s=90.0, window_s=90.0)
    play(changed, clock, [*first, first[0]])  # 90 seconds covered: the baseline is complete
    play(changed, clock, second)
    found = changed.report()
    assert found is not None and found.score > THRESHOLD and found.changed.startswith("class mix: "), found
    clock = Clock()
    repeated = tracker(clock, baseline_s=90.0, window_s=90.0)
    play(repeated, clock, [*first, first[0]])
    play(repeated, clock, first)
    found = repeated.report()
    assert found is not None and found.score < THRESHOLD / 3, found
