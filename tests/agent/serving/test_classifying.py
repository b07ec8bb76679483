"""`agent.serving.classifying`: the second stage's schedule (an injected clock), its bounded queue
(the oldest dropped and counted), and the shipped demo classifier through the real ONNX Runtime
and LiteRT on crops of the synthetic scene's shapes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from testkit.classifying import Clock, demo_classifier

from agent.serving.classifying import ClassifyingStage, ClassifySchedule
from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def stage(clock: Clock) -> Iterator[ClassifyingStage]:
    stage = ClassifyingStage(capacity=4, clock=clock)
    stage.serve(demo_classifier())
    yield stage
    stage.stop()


IMAGE, TRUTH = SyntheticScene(num_shapes=5, seed=340_001).render(2)
SHAPES = [
    (box.tolist(), int(cls))
    for box, cls, shown in zip(TRUTH.detections.xyxy, TRUTH.detections.class_id, TRUTH.visible, strict=True)
    if shown > 0.9
]


@pytest.mark.parametrize(
    ("every_s", "times", "due"),
    [
        (5.0, [0.0, 4.999, 5.0, 9.999, 10.0], [True, False, True, False, True]),  # at exactly every_s: due
        (5.0, [0.0, 7.0, 11.999, 12.0], [True, True, False, True]),  # counted from the last time asked
        (0.5, [0.0, 0.25, 0.5, 0.5], [True, False, True, False]),
    ],
)
def test_the_schedule_is_once_on_confirm_then_every_s_and_not_before(
    every_s: float, times: list[float], due: list[bool]
) -> None:
    schedule = ClassifySchedule(every_s)
    assert [schedule.due("track", t) for t in times] == due
    assert schedule.due("another", times[-1]), "each object has its own schedule"
    assert schedule.forget("track") and not schedule.forget("track")
    assert schedule.due("track", times[-1]), "forgotten: the next one is a first again"


def test_the_schedule_refuses_a_period_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="every_s must be above 0 seconds, got 0"):
        ClassifySchedule(0.0)


def test_a_track_is_classified_when_confirmed_then_again_only_after_every_s(
    stage: ClassifyingStage, clock: Clock
) -> None:
    box, cls = SHAPES[0]
    assert stage.offer("cam0", 1, "square", IMAGE, box), "the first offer: the track was just confirmed"
    assert stage.step() and not stage.step(), "one crop queued, classified"
    first = stage.result("cam0", 1)
    assert first is not None and first.class_id == cls and first.label == CLASS_NAMES[cls] and first.at == 100.0
    clock.now = 104.999
    assert not stage.offer("cam0", 1, "square", IMAGE, box), "before every_s: not again"
    clock.now = 105.0
    assert stage.offer("cam0", 1, "square", IMAGE, box), "at every_s: again"
    stage.step()
    again = stage.result("cam0", 1)
    assert again is not None and again.at == 105.0
    assert stage.counts().requested == 2 and stage.counts().classified == 2


@pytest.mark.parametrize("name", ["demo_classify.onnx", "demo_classify_fp32.tflite", "demo_classify_int8.tflite"])
def test_each_shapes_crop_gets_its_true_class(clock: Clock, name: str) -> None:
    """The crops are cut from the frame with the track's box; the answer is the shape's class."""
    stage = ClassifyingStage(capacity=len(SHAPES), clock=clock)
    stage.serve(demo_classifier(name))
    try:
        assert len(SHAPES) >= 3 and len({c for _, c in SHAPES}) >= 2
        for track_id, (box, _) in enumerate(SHAPES):
            assert stage.offer("cam0", track_id, "circle", IMAGE, box)
        while stage.step():
            pass
        answers = [stage.result("cam0", t) for t in range(len(SHAPES))]
        assert [a.class_id if a else None for a in answers] == [c for _, c in SHAPES]
        assert all(a is not None and 0.5 < a.score <= 1.0 for a in answers)
    finally:
        stage.stop()


def test_a_full_queue_drops_the_oldest_request_and_counts_it(stage: ClassifyingStage) -> None:
    box = SHAPES[0][0]
    for track_id in range(6):  # capacity 4, nothing classified meanwhile
        assert stage.offer("cam0", track_id, "circle", IMAGE, box)
    assert stage.waiting() == [("cam0", t) for t in (2, 3, 4, 5)], "the two oldest dropped"
    counts = stage.counts()
    assert (counts.requested, counts.dropped) == (6, 2)
    while stage.step():
        pass
    assert stage.result("cam0", 0) is None and stage.result("cam0", 5) is not None
    assert stage.counts().classified == 4


def test_only_the_labels_it_is_for_are_classified(clock: Clock) -> None:
    stage = ClassifyingStage(clock=clock)
    stage.serve(demo_classifier(for_labels=("square",)))
    try:
        box = SHAPES[0][0]
        assert not stage.offer("cam0", 1, "circle", IMAGE, box)
        assert stage.offer("cam0", 2, "square", IMAGE, box)
        assert stage.waiting() == [("cam0", 2)]
        stage.step()
        assert stage.result("cam0", 2) is not None
        assert not stage.offer("cam0", 2, "circle", IMAGE, box), "its track's label changed"
        assert stage.result("cam0", 2) is None and stage.held() == 0, "so its class is gone"
    finally:
        stage.stop()


def test_without_a_classifier_nothing_is_queued(clock: Clock) -> None:
    stage = ClassifyingStage(clock=clock)
    assert not stage.active and not stage.offer("cam0", 1, "circle", IMAGE, SHAPES[0][0])
    assert stage.held() == 0


def test_an_answer_for_a_track_that_ended_is_discarded(stage: ClassifyingStage) -> None:
    box = SHAPES[0][0]
    stage.offer("cam0", 1, "circle", IMAGE, box)
    stage.offer("cam0", 2, "circle", IMAGE, box)
    stage.forget("cam0", 1)  # its track ended while its crop waited
    while stage.step():
        pass
    assert stage.result("cam0", 1) is None and stage.result("cam0", 2) is not None
    stage.forget("cam0", 2)
    assert stage.held() == 0, "nothing per track is left once the tracks ended"


def test_a_box_outside_the_frame_queues_nothing(stage: ClassifyingStage) -> None:
    assert not stage.offer("cam0", 1, "circle", IMAGE, [700.0, 10.0, 720.0, 30.0])
    assert stage.waiting() == []


def test_a_new_version_drops_the_old_answers_and_closes_the_old_classifier(stage: ClassifyingStage) -> None:
    stage.offer("cam0", 1, "circle", IMAGE, SHAPES[0][0])
    stage.step()
    assert stage.result("cam0", 1) is not None
    old = stage._loaded
    assert old is not None
    stage.serve(demo_classifier("demo_classify_int8.tflite"))
    assert stage.result("cam0", 1) is None and stage.waiting() == []
    with pytest.raises(Exception):  # noqa: B017 - closed: any runtime error will do
        old.classifier.classify(IMAGE[:64, :64])


def test_the_classify_thread_is_named_and_survives_a_failed_turn(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that raises costs that step: the thread goes on (after a backoff), counts the
    failure and says what failed; health hears of it; the next good step clears it."""
    stage = ClassifyingStage(clock=clock)
    assert stage.loop().ended is None and stage.loop().stalled_s == 0.0, "not started: nothing to judge"
    steps: list[bool] = []
    recovered = threading.Event()

    def flaky(wait: bool = False) -> bool:
        steps.append(wait)
        if len(steps) == 1:
            raise RuntimeError("planted")
        if len(steps) >= 3:  # the second step returned well
            recovered.set()
        time.sleep(0.01)  # an idle step waits for work
        return False

    monkeypatch.setattr(stage, "step", flaky)
    monkeypatch.setattr(stage._worker._backoff, "next_delay", lambda: 0.0)
    stage.start()
    thread = stage._worker._thread
    assert thread is not None and thread.name == "classify"
    assert recovered.wait(10), "the thread took more steps after the failed one"
    state = stage.loop()
    assert state.ended is None and state.failures == 1 and state.failing is None, state
    stage.stop()
    assert not thread.is_alive()
