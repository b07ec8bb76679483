"""The shadow's and probation's judgements (`agent.deployment.quality`): pure, clock injected."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from agent.config.models import ShadowSection
from agent.deployment.quality import (
    FRAMES_ONLY_MAX_S,
    MIN_AFTER_FRAMES,
    ShadowJudge,
    ShadowPlan,
    judge_rates,
    passes,
    shadow_plan,
)
from agent.mqtt.quality_request import ShadowRequest
from pipelines.detection_rates import ClassRate, Rates
from pipelines.measure.comparison import AgreementReport, ClassAgreement

PLAN = ShadowPlan(duration_s=60, frames=None, max_s=240, min_agreement=0.8, min_detections=30, min_class_detections=10)
LABELS = {0: "person", 1: "car"}


def report(*classes: tuple[int, int, int, int], frames: int = 100) -> AgreementReport:
    """Rows of (class id, serving, candidate, matched); all confident."""
    return AgreementReport(frames, tuple(ClassAgreement(c, s, k, m, s, k) for c, s, k, m in classes))


AGREE = report((0, 40, 40, 38), (1, 20, 20, 19))


def judge(plan: ShadowPlan = PLAN) -> ShadowJudge:
    return ShadowJudge(plan, start=100.0, label=LABELS.get)


def test_nothing_is_decided_before_the_duration() -> None:
    assert judge().observe({"door": AGREE}, now=159.9) is None
    record = judge().observe({"door": AGREE}, now=160.0)
    assert record is not None and record.outcome == "agrees" and record.seconds == 60.0
    assert record.cameras[0].camera == "door" and record.cameras[0].classes[0].label == "person"
    assert passes(record, "pass")


def test_a_frame_count_ends_it_once_every_camera_compared_that_many() -> None:
    plan = ShadowPlan(duration_s=None, frames=100, max_s=600, min_agreement=0.8)
    assert judge(plan).observe({"a": AGREE, "b": report((0, 40, 40, 40), frames=99)}, now=101) is None
    assert judge(plan).observe({"a": AGREE, "b": report((0, 40, 40, 40), frames=100)}, now=101) is not None


def test_agreement_below_the_minimum_disagrees_with_the_numbers() -> None:
    record = judge().observe({"door": report((0, 40, 40, 20))}, now=160)  # F1 0.5
    assert record is not None and record.outcome == "disagrees"
    assert "camera door: agreement 0.50 < 0.8" in record.message
    assert not passes(record, "pass")
    at_the_line = judge().observe({"door": report((0, 40, 40, 32))}, now=160)  # F1 exactly 0.8
    assert at_the_line is not None and at_the_line.outcome == "agrees"


def test_a_frequent_class_that_disagrees_fails_even_where_the_frame_agrees() -> None:
    cars_swapped = report((0, 100, 100, 100), (1, 12, 12, 0))  # overall F1 0.89
    record = judge().observe({"door": cars_swapped}, now=160)
    assert record is not None and record.outcome == "disagrees" and "car agreement 0.00" in record.message
    rare = report((0, 100, 100, 100), (1, 9, 9, 0))  # below min_class_detections: not judged alone
    assert judge().observe({"door": rare}, now=160).outcome == "agrees"  # type: ignore[union-attr]


def test_the_task_measure_is_held_to_the_same_minimum() -> None:
    masks = AgreementReport(100, AGREE.classes, task="masks", task_score=0.6)
    record = judge().observe({"door": masks}, now=160)
    assert record is not None and record.outcome == "disagrees" and "masks agreement 0.60" in record.message


def test_a_quiet_scene_extends_the_shadow_then_ends_as_asked() -> None:
    quiet = {"door": report((0, 29, 3, 3))}  # fewer than 30 detections of either
    assert judge().observe(quiet, now=160) is None
    assert judge().observe(quiet, now=339.9) is None
    record = judge().observe(quiet, now=340)
    assert record is not None and record.outcome == "quiet" and "door: 29" in record.message
    assert passes(record, "pass") and not passes(record, "fail")
    busy = {"door": report((0, 5, 30, 5))}  # the candidate alone saw enough: judged (and disagrees)
    assert judge().observe(busy, now=160).outcome == "disagrees"  # type: ignore[union-attr]


def test_report_mode_records_a_disagreement_and_goes_on() -> None:
    plan = ShadowPlan(duration_s=60, frames=None, max_s=240, min_agreement=0.8, mode="report")
    record = judge(plan).observe({"door": report((0, 40, 40, 0))}, now=160)
    assert record is not None and record.outcome == "disagrees" and record.mode == "report"
    assert passes(record, "fail")


@pytest.mark.parametrize("bad", [{"duration_s": None, "frames": None}, {"min_agreement": 1.5}])
def test_a_plan_without_an_end_or_with_a_threshold_outside_0_1_is_refused(bad: dict[str, object]) -> None:
    fields: dict[str, object] = {"duration_s": 60, "frames": None, "max_s": 240, "min_agreement": 0.8} | bad
    with pytest.raises(ValueError, match=r"duration or a frame count|within 0\.\.1"):
        ShadowPlan(**fields)  # type: ignore[arg-type]


def rates(frames: int, seconds: float = 60.0, **counts: int) -> Rates:
    """`counts` by class, as c0=.., c1=..; every detection at 0.8."""
    classes = {int(k[1:]): ClassRate(n, n * 0.8) for k, n in counts.items()}
    return Rates(frames, seconds, MappingProxyType(classes))


BEFORE = {"door": rates(600, 600, c0=300, c1=60)}  # 0.5 and 0.1 a frame


def test_the_same_rates_keep_the_version() -> None:
    record = judge_rates(BEFORE, {"door": rates(120, c0=60, c1=12)}, min_ratio=0.5, min_before=30, label=LABELS.get)
    assert record.outcome == "kept" and record.cameras[0].ratio == 1.0
    person = record.cameras[0].classes[0]
    assert (person.label, person.before_per_min, person.after_per_min) == ("person", 30.0, 60.0)


def test_a_collapse_below_the_fraction_is_blind() -> None:
    record = judge_rates(BEFORE, {"door": rates(120, c0=10, c1=2)}, min_ratio=0.5, min_before=30)
    assert record.outcome == "blind" and "camera door: 12 confident detections in 120 frames" in record.message
    at_the_line = judge_rates(BEFORE, {"door": rates(120, c0=30, c1=6)}, min_ratio=0.5, min_before=30)
    assert at_the_line.outcome == "kept"


def test_a_class_seen_often_that_vanishes_is_blind_though_the_total_holds() -> None:
    swapped_in = judge_rates(BEFORE, {"door": rates(120, c0=72)}, min_ratio=0.5, min_before=30, label=LABELS.get)
    assert swapped_in.outcome == "blind" and "camera door: car seen 0.000 times a frame" in swapped_in.message
    few_frames = judge_rates(BEFORE, {"door": rates(99, c0=60)}, min_ratio=0.5, min_before=30)
    assert few_frames.outcome == "kept", "0.1 a frame over 99 frames expects under 10 cars: not judged"


def test_a_quiet_scene_before_the_swap_never_fails_a_version() -> None:
    quiet = {"door": rates(600, 600, c0=29)}
    record = judge_rates(quiet, {"door": rates(120)}, min_ratio=0.5, min_before=30)
    assert record.outcome == "quiet" and record.cameras[0].ratio is None


def test_too_few_frames_since_the_swap_judge_nothing() -> None:
    record = judge_rates(BEFORE, {"door": rates(MIN_AFTER_FRAMES - 1)}, min_ratio=0.5, min_before=30)
    assert record.outcome == "quiet"
    assert judge_rates(BEFORE, {"door": rates(MIN_AFTER_FRAMES)}, min_ratio=0.5, min_before=30).outcome == "blind"


@pytest.mark.parametrize(
    ("request_", "section", "expected"),
    [
        (None, {}, None),  # neither asks: no shadow
        ({"duration_s": 20}, {}, (20, None, 80, 0.8, "gate", "pass")),  # max 4 x duration, agent.yaml's defaults
        (
            {"duration_s": 20, "max_s": 30, "min_agreement": 0.9, "mode": "report", "quiet": "fail"},
            {"min_agreement": 0.5},
            (20, None, 30, 0.9, "report", "fail"),  # the signed document wins key by key
        ),
        (None, {"duration_s": 60, "mode": "report"}, (60, None, 240, 0.8, "report", "pass")),  # agent.yaml requires it
        ({"duration_s": 10}, {"duration_s": 60}, (60, None, 240, 0.8, "gate", "pass")),  # at least agent.yaml's
        ({"frames": 500}, {}, (None, 500, FRAMES_ONLY_MAX_S, 0.8, "gate", "pass")),
        ({"duration_s": 20}, {"max_s": 10}, (20, None, 20, 0.8, "gate", "pass")),  # max never below the duration
    ],
)
def test_the_shadow_plan_is_the_signed_request_over_agent_yaml(
    request_: dict[str, object] | None, section: dict[str, object], expected: tuple[object, ...] | None
) -> None:
    plan = shadow_plan(ShadowRequest.model_validate(request_) if request_ else None, ShadowSection(**section))
    got = (
        None if plan is None else (plan.duration_s, plan.frames, plan.max_s, plan.min_agreement, plan.mode, plan.quiet)
    )
    assert got == expected
