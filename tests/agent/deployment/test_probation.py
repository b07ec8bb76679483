"""`agent.deployment.probation.ProbationJudge`: is the new version serving as well as the old?"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from testkit import DEMO_MODELS
from testkit.onnx_models import altered
from testkit.real_models import COCO_MODEL, photo_frame, write_clip, wrong_versions

from agent.config.models import QualitySection
from agent.deployment.probation import PASSED, ProbationJudge, QualityCheck
from agent.errors import ErrorCode
from agent.mqtt.quality_request import QualityRequest
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.detection_rates import ClassRate, Rates
from pipelines.latency import Percentiles
from pipelines.measure.comparison import Agreement, AgreementReport, ClassAgreement
from pipelines.pipeline import Pipeline, PipelineStats
from pipelines.sources.capture import FileSource
from pipelines.sources.frames import Frame, FrameSource, SourceState
from pipelines.sources.scene_source import SyntheticSource
from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene
from runtimes.registry import load_runtime


def stats(
    name: str,
    frames: int,
    errors: int = 0,
    fps: float = 10.0,
    state: str = "running",
    paused: bool = False,
    max_fps: float | None = None,
    bad: int = 0,
    rates: Rates | None = None,
):
    return PipelineStats(
        name=name,
        source="synthetic",
        fps=fps,
        frames=frames,
        dropped=0,
        errors=errors,
        swaps=0,
        paused=paused,
        max_fps=max_fps,
        workers=1,
        latency_ms={"total": Percentiles(1.0, 2.0)},
        source_status=SourceState(state, None, 0),  # type: ignore[arg-type]
        runtime="onnxruntime",
        model="m.onnx",
        bad_outputs=bad,
        bad_output="output 0 (1, 84, 8400) is all NaN or infinite" if bad else None,
        rates=rates if rates is not None else Rates(),
    )


# (before the swap, observations as (seconds since the swap, stats), expected verdict or words in it)
PROBATION_CASES = {
    "serves as well": ([stats("a", 100)], [(5, [stats("a", 150)]), (10, [stats("a", 200, fps=9.0)])], PASSED),
    "frames keep failing": ([stats("a", 100)], [(2, [stats("a", 100, errors=3)])], "3 frames failed"),
    "no frame at all": ([stats("a", 100)], [(10, [stats("a", 100)])], "inferred no frame"),
    "half the fps": (
        [stats("a", 100, fps=10.0)],
        [(5, [stats("a", 130, fps=4.0)]), (10, [stats("a", 160, fps=4.5)])],
        "4.2 FPS, below 0.5 x the 10.0 FPS",
    ),
    "paused cameras are not compared": (
        [stats("a", 100, fps=10.0)],
        [(6, [stats("a", 120, fps=0.5, paused=True)]), (10, [stats("a", 121, fps=0.5, paused=True)])],
        PASSED,
    ),
    "capped below the old fps": (  # the governor's cap (4) is the baseline, not the old 10 FPS
        [stats("a", 100, fps=10.0)],
        [(5, [stats("a", 120, fps=3.9, max_fps=4.0)]), (10, [stats("a", 140, fps=3.8, max_fps=4.0)])],
        PASSED,
    ),
    "slow under the cap": (
        [stats("a", 100, fps=10.0)],
        [(5, [stats("a", 110, fps=1.5, max_fps=4.0)]), (10, [stats("a", 118, fps=1.5, max_fps=4.0)])],
        "1.5 FPS, below 0.5 x the 4.0 FPS",
    ),
    "capped above the old fps": (  # a cap the old version never reached changes nothing
        [stats("a", 100, fps=10.0)],
        [(5, [stats("a", 120, fps=4.0, max_fps=15.0)]), (10, [stats("a", 140, fps=4.0, max_fps=15.0)])],
        "4.0 FPS, below 0.5 x the 10.0 FPS",
    ),
    # a deployment that moves a camera between runtimes restarts its pipeline: counters from 0
    "a camera restarted by the swap": (
        [stats("a", 600)],
        [(1, [stats("a", 8)]), (5, [stats("a", 48)]), (10, [stats("a", 98)])],
        PASSED,
    ),
    "a restarted camera that infers nothing": (
        [stats("a", 600)],
        [(1, [stats("a", 0)]), (10, [stats("a", 0)])],
        "inferred no frame",
    ),
    "a restarted camera whose frames keep failing": (
        [stats("a", 600, errors=5)],
        [(2, [stats("a", 0, errors=3)])],
        "3 frames failed",
    ),
    # a runtime (a plugin) whose output is all NaN or the wrong shape on every frame
    "unusable output on every frame": (
        [stats("a", 100)],
        [(2, [stats("a", 100, errors=3, bad=3)])],
        "output was unusable on 3 frames of the new version and none succeeded (output 0 (1, 84, 8400) is all NaN",
    ),
    "unusable output on most frames": (
        [stats("a", 100, errors=1, bad=1)],
        [(5, [stats("a", 105, errors=7, bad=7)]), (10, [stats("a", 110, errors=13, bad=13)])],
        "output was unusable on 12 frames of the new version, more than the 10 it inferred",
    ),
    "unusable output on a few frames": (
        [stats("a", 100)],
        [(5, [stats("a", 150, errors=2, bad=2)]), (10, [stats("a", 200, errors=4, bad=4)])],
        PASSED,
    ),
    "a camera the new version started": ([], [(5, [stats("b", 40)]), (10, [stats("b", 90)])], PASSED),
    "a lost camera is not the model's fault": (
        [stats("a", 100)],
        [(10, [stats("a", 100, fps=0.0, state="reconnecting")])],
        PASSED,
    ),
}


@pytest.mark.parametrize("case", list(PROBATION_CASES))
def test_probation_judge(case: str) -> None:
    before, observations, expected = PROBATION_CASES[case]
    judge = ProbationJudge(before, start=100.0, duration_s=10, min_fps_ratio=0.5)
    verdicts = [judge.observe(observed, 100.0 + at) for at, observed in observations]
    assert all(v is None for v in verdicts[:-1]), verdicts
    assert verdicts[-1] is not None and expected in verdicts[-1], verdicts


# -- quality on probation -------------------------------------------------------------------


def rates(frames: int, **counts: int) -> Rates:
    """`counts` by class, as c0=.., c1=..; every detection at 0.8; a frame a tenth of a second."""
    classes = {int(k[1:]): ClassRate(n, n * 0.8) for k, n in counts.items()}
    return Rates(frames, frames / 10, MappingProxyType(classes))


CHECK = QualityCheck(min_ratio=0.5, min_before=30, labels=("person", "car"))
SEEING = rates(600, c0=300, c1=60)  # what the previous version saw: 0.5 people and 0.1 cars a frame


def probation(before: Rates, after: Rates, check: QualityCheck | None = CHECK, **after_stats) -> ProbationJudge:
    """A probation of 10 s on camera "a" that inferred `after.frames` frames since the swap,
    ended with `after` as its rates; its verdict in `.verdict`."""
    judge = ProbationJudge([stats("a", 1000, rates=before)], 100.0, 10, 0.5, quality=check)
    frames = after_stats.pop("frames", 1000 + after.frames)
    judge.verdict = judge.observe([stats("a", frames, rates=after, **after_stats)], 110.0)  # type: ignore[attr-defined]
    return judge


def test_a_version_that_sees_what_the_previous_one_saw_is_kept_and_recorded() -> None:
    judge = probation(SEEING, rates(100, c0=50, c1=10))
    assert judge.verdict == PASSED  # type: ignore[attr-defined]
    assert judge.quality is not None and judge.quality.outcome == "kept" and judge.quality.min_ratio == 0.5
    assert [c.label for c in judge.quality.cameras[0].classes] == ["person", "car"]


def test_a_blind_version_fails_with_probation_blind_and_the_numbers() -> None:
    judge = probation(SEEING, rates(100, c0=10))
    assert judge.code == ErrorCode.PROBATION_BLIND
    assert judge.verdict.startswith("camera a: 10 confident detections in 100 frames")  # type: ignore[attr-defined]
    assert judge.quality is not None and judge.quality.outcome == "blind"
    assert judge.quality.cameras[0].ratio == 0.167


def test_two_classes_swapped_are_caught_by_the_class_that_vanished() -> None:
    judge = probation(SEEING, rates(100, c0=10, c1=50))  # 0.6 a frame as before, people seen as cars
    assert (
        judge.code == ErrorCode.PROBATION_BLIND and "camera a: person seen 0.100 times a frame, 0.20 x" in judge.verdict
    )  # type: ignore[attr-defined]
    assert judge.quality is not None and judge.quality.cameras[0].ratio == 1.0


def test_a_quiet_scene_never_fails_a_version() -> None:
    for after in (rates(100), rates(30), rates(100, c0=1)):
        judge = probation(rates(600, c0=29, c1=0), after)
        assert judge.verdict == PASSED and judge.code == ErrorCode.PROBATION_FAILED  # type: ignore[attr-defined]
        assert judge.quality is not None and judge.quality.outcome == "quiet", after


def test_min_ratio_0_turns_the_quality_check_off() -> None:
    judge = probation(SEEING, rates(100), check=QualityCheck(min_ratio=0.0, min_before=30))
    assert judge.verdict == PASSED and judge.quality is None  # type: ignore[attr-defined]
    assert probation(SEEING, rates(100), check=None).quality is None


def test_quality_is_judged_only_once_the_other_checks_passed() -> None:
    judge = probation(SEEING, rates(0), frames=1000)  # no frame inferred: the older check fails first
    assert "inferred no frame" in judge.verdict and judge.code == ErrorCode.PROBATION_FAILED  # type: ignore[attr-defined]
    assert judge.quality is None


def test_rates_that_still_hold_the_previous_versions_frames_are_not_judged() -> None:
    """A camera that delivered no frame of the new version still shows the previous one's rates
    (more frames than it inferred since the swap): not compared with themselves."""
    judge = probation(SEEING, rates(20, c0=0), frames=1010)  # 10 frames since the swap, 20 in the rates
    assert judge.quality is not None and judge.quality.cameras == ()
    judge = probation(SEEING, rates(40), frames=1040)
    assert judge.code == ErrorCode.PROBATION_BLIND


def test_a_camera_whose_pipeline_restarted_is_judged_on_what_it_saw_since() -> None:
    """Its counters and its rates began again at the restart (workers changed)."""
    judge = ProbationJudge([stats("a", 1000, rates=SEEING)], 100.0, 10, 0.5, quality=CHECK)
    assert judge.observe([stats("a", 1030, rates=rates(30, c0=15, c1=3))], 103.0) is None
    verdict = judge.observe([stats("a", 40, rates=rates(40, c0=2))], 110.0)  # restarted: 40 frames since
    assert judge.code == ErrorCode.PROBATION_BLIND and verdict is not None and "in 40 frames" in verdict
    judge = ProbationJudge([stats("a", 1000, rates=SEEING)], 100.0, 10, 0.5, quality=CHECK)
    judge.observe([stats("a", 1030, rates=rates(30, c0=15, c1=3))], 103.0)
    assert judge.observe([stats("a", 20, rates=rates(20))], 110.0) == PASSED, "20 frames since: too few to judge"
    assert judge.quality is not None and judge.quality.outcome == "quiet"


@pytest.mark.parametrize(
    ("request_", "expected"),
    [(None, 0.5), (QualityRequest(), 0.5), (QualityRequest(min_ratio=0.8), 0.8), (QualityRequest(min_ratio=0), 0.0)],
)
def test_the_signed_documents_min_ratio_wins_over_agent_yaml(request_: QualityRequest | None, expected: float) -> None:
    check = QualityCheck.of(request_, QualitySection(min_ratio=0.5, min_before=12), ["person"])
    assert (check.min_ratio, check.min_before, check.label(0), check.label(1), check.label(-1)) == (
        expected,
        12,
        "person",
        None,
        None,
    )


def compared(matched: int, each: int = 40, frames: int = 20) -> dict[str, AgreementReport]:
    """Camera "a"'s comparison with the previous version: `each` detections of class 0 on each
    side, `matched` of them at the same place (agreement matched / each)."""
    return {"a": AgreementReport(frames, (ClassAgreement(0, each, each, matched, each, each),))}


AGREEING = QualityCheck(min_ratio=0.5, min_before=30, labels=("person", "car"), min_agreement=0.5)


@pytest.mark.parametrize(
    ("check", "agreements", "outcome", "words"),
    [
        (AGREEING, compared(10), "blind", "camera a: agreement 0.25 < 0.5 (precision 0.25, recall 0.25 against the"),
        (AGREEING, compared(20), "kept", "the new version agrees with the previous version (agreement a 0.50;"),
        (AGREEING, compared(0, each=29), "kept", "too few detections to compare"),  # 29 < min_before: quiet
        (replace(AGREEING, min_ratio=0.0), compared(10), "blind", "camera a: agreement 0.25"),  # without rates
        (replace(AGREEING, min_agreement=0.0), compared(0), "kept", "sees what the previous one saw"),  # off
        (AGREEING, None, "kept", "sees what the previous one saw"),  # the previous version did not load
    ],
)
def test_the_agreement_with_the_previous_version_on_the_same_frames(
    check: QualityCheck, agreements: dict[str, AgreementReport] | None, outcome: str, words: str
) -> None:
    """Rates alike (a version whose boxes moved keeps them): only the agreement can fail it."""
    judge = ProbationJudge([stats("a", 1000, rates=SEEING)], 100.0, 10, 0.5, quality=check)
    verdict = judge.observe([stats("a", 1100, rates=rates(100, c0=50, c1=10))], 110.0, agreements)
    assert judge.quality is not None and judge.quality.outcome == outcome and words in judge.quality.message
    assert (verdict == PASSED) == (outcome != "blind")
    assert judge.code == (ErrorCode.PROBATION_BLIND if outcome == "blind" else ErrorCode.PROBATION_FAILED)
    compared_too = check.min_agreement > 0 and agreements is not None
    assert (judge.quality.agreement is not None) == compared_too
    if judge.quality.agreement is not None:
        assert judge.quality.agreement.cameras[0].camera == "a" and judge.quality.agreement.min_agreement == 0.5


def test_a_blind_rate_and_a_disagreement_are_both_said() -> None:
    judge = ProbationJudge([stats("a", 1000, rates=SEEING)], 100.0, 10, 0.5, quality=AGREEING)
    verdict = judge.observe([stats("a", 1100, rates=rates(100, c0=10))], 110.0, compared(10))
    assert verdict is not None and verdict.startswith("camera a: 10 confident detections in 100 frames")
    assert "; camera a: agreement 0.25 < 0.5" in verdict and judge.code == ErrorCode.PROBATION_BLIND


def test_the_agreement_is_judged_at_the_end_only() -> None:
    judge = ProbationJudge([stats("a", 1000, rates=SEEING)], 100.0, 10, 0.5, quality=AGREEING)
    assert judge.observe([stats("a", 1050, rates=rates(50, c0=25, c1=5))], 109.9, compared(0)) is None
    assert judge.quality is None


@pytest.mark.parametrize(
    ("request_", "expected"),
    [(None, 0.0), (QualityRequest(min_ratio=0.8), 0.0), (QualityRequest(min_agreement=0.6), 0.6)],
)
def test_the_signed_documents_min_agreement_wins_over_agent_yaml(
    request_: QualityRequest | None, expected: float
) -> None:
    assert QualityCheck.of(request_, QualitySection()).min_agreement == expected
    assert QualityCheck.of(request_, QualitySection(min_agreement=0.7)).min_agreement == (expected or 0.7)


# -- a real pipeline swapping to an altered model -----------------------------------------------

SWAP_AT, FRAMES = 40, 100  # frames on the previous version, in all


#: the wrong versions of the demo detector (`testkit.onnx_models.altered`), by name
ALTERATIONS: dict[str, dict[str, Any]] = {
    "scores": {"score_scale": 0.2},
    "swap": {"swap": (0, 1)},
    "shift": {"shift": 0.2},
}


def altered_demo(tmp_path: Path, how: str) -> Path:
    return altered(DEMO_MODELS / "demo_detector.onnx", tmp_path / f"demo_{how}.onnx", **ALTERATIONS[how])


def serve(model: Path) -> Detector:
    return Detector(load_runtime("onnxruntime", model))


def probation_on_a_real_pipeline(
    new: Path,
    scene: SyntheticScene | None = None,
    *,
    original: Path = DEMO_MODELS / "demo_detector.onnx",
    source: FrameSource | None = None,
    labels: Sequence[str] = CLASS_NAMES,
    swap_at: int = SWAP_AT,
    min_agreement: float = 0.0,
) -> ProbationJudge:
    """`original` (the demo detector) serves `scene` for `FRAMES` frames (or `source` to its
    end), swapping to `new` after `swap_at` frames; the judge gets the stats just before the
    swap and at the end (its clock: 10 s of probation). With `min_agreement`, `original` also
    runs on every frame after the swap, as the previous version does beside the new one (the
    shadow's session itself is tested in tests/agent/serving/test_shadow.py)."""
    source = source if source is not None else SyntheticSource(scene or SyntheticScene(), frames=FRAMES)
    pipeline = Pipeline("cam", source, serve(original))
    judges: list[ProbationJudge] = []
    reference, agreement = serve(original), Agreement()
    check = QualityCheck(0.5, 30, labels, min_agreement)

    def swap(frame: Frame, detections: Detections) -> None:
        if frame.index == swap_at - 1:
            judges.append(ProbationJudge([pipeline.stats()], 100.0, 10, 0.5, quality=check))
            pipeline.swap_detector(serve(new))
        elif frame.index >= swap_at and min_agreement > 0:
            agreement.add(reference.detect(frame.image), detections)

    pipeline.add_sink(swap)
    pipeline.start()
    assert pipeline.wait(120)
    pipeline.stop()
    judge = judges[0]
    judge.verdict = judge.observe([pipeline.stats()], 110.0, {"cam": agreement.report()})  # type: ignore[attr-defined]
    assert pipeline.stats().rates.frames == pipeline.stats().frames - swap_at
    return judge


SHAPES = SyntheticScene()  # seed 0: three squares, two triangles, no circle (a swap shows)


@pytest.mark.parametrize(
    ("how", "outcome", "words"),
    [
        ("scores", "blind", "camera cam: 0 confident detections in 60 frames"),
        ("swap", "blind", "camera cam: square seen 0.000 times a frame"),
        ("shift", "kept", "the new version sees what the previous one saw"),  # not caught: the shadow is
    ],
)
def test_an_altered_model_on_a_real_pipeline(tmp_path: Path, how: str, outcome: str, words: str) -> None:
    judge = probation_on_a_real_pipeline(altered_demo(tmp_path, how), SHAPES)
    assert judge.quality is not None and judge.quality.outcome == outcome, judge.quality
    assert words in judge.quality.message
    assert judge.code == (ErrorCode.PROBATION_BLIND if outcome == "blind" else ErrorCode.PROBATION_FAILED)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["scores", "swap", "shift"])
def test_each_altered_model_disagrees_with_the_previous_version_on_the_same_frames(tmp_path: Path, how: str) -> None:
    """With ``min_agreement`` the boxes moved by a fifth of the input fail probation too."""
    judge = probation_on_a_real_pipeline(altered_demo(tmp_path, how), SHAPES, min_agreement=0.5)
    assert judge.code == ErrorCode.PROBATION_BLIND and judge.quality is not None
    assert judge.quality.agreement is not None and judge.quality.agreement.outcome == "disagrees"
    assert "against the previous version over 60 frames" in judge.quality.message
    if how == "shift":  # its rates alone keep it: the agreement is all that fails it
        assert judge.quality.message.startswith("camera cam: agreement "), judge.quality.message


@pytest.mark.slow
@pytest.mark.parametrize("model", ["demo_detector.onnx", "demo_detector_int8_qdq.onnx"])
def test_the_same_network_and_its_int8_variant_are_kept(model: str) -> None:
    judge = probation_on_a_real_pipeline(DEMO_MODELS / model, SHAPES, min_agreement=0.8)
    assert judge.verdict == PASSED and judge.quality is not None and judge.quality.outcome == "kept", judge.quality  # type: ignore[attr-defined]
    assert {c.label for c in judge.quality.cameras[0].classes} == {"square", "triangle"}
    assert judge.quality.agreement is not None and judge.quality.agreement.outcome == "agrees"


@pytest.mark.parametrize("min_agreement", [0.0, 0.5])
def test_an_empty_scene_fails_nothing_even_a_blind_model(tmp_path: Path, min_agreement: float) -> None:
    judge = probation_on_a_real_pipeline(
        altered_demo(tmp_path, "shift"), SyntheticScene(num_shapes=0), min_agreement=min_agreement
    )
    assert judge.verdict == PASSED and judge.quality is not None and judge.quality.outcome == "quiet"  # type: ignore[attr-defined]


# -- the shared COCO YOLOv8n on the tiled photos (one person, one cat, one cup, one table a frame) --

COCO_SWAP_AT, COCO_FRAMES = 12, 44  # 48 confident detections (12 people) before, 32 frames after


@pytest.fixture(scope="module")
def coco(shared_models: Path, photos: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """YOLOv8n, its wrong versions (person and dog swapped: the frame shows a person and no
    dog, so the swap takes a class away rather than renaming one as frequent) and the clip."""
    folder = tmp_path_factory.mktemp("coco")
    model = shared_models / COCO_MODEL
    clip = write_clip(folder / "photos.avi", [photo_frame(photos)] * COCO_FRAMES)
    return {"original": model, "resigned": model, "clip": clip, **wrong_versions(model, folder, (0, 16))}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("how", "min_agreement", "outcome", "words"),
    [
        ("score_scale", 0.0, "blind", "camera cam: 0 confident detections in 32 frames"),
        ("swap", 0.0, "blind", "camera cam: person seen 0.000 times a frame"),
        ("shift", 0.0, "kept", "the new version sees what the previous one saw"),  # rates alone: not caught
        ("shift", 0.5, "blind", "camera cam: agreement 0.00 < 0.5"),  # the previous version beside it
        ("resigned", 0.0, "kept", "the new version sees what the previous one saw (cam 1.00)"),
        ("resigned", 0.8, "kept", "the new version agrees with the previous version (agreement cam 1.00;"),
    ],
)
def test_an_altered_coco_model_on_a_real_pipeline(
    coco: dict[str, Path], shared_models: Path, how: str, min_agreement: float, outcome: str, words: str
) -> None:
    labels = (shared_models / "coco80_labels.txt").read_text().splitlines()
    judge = probation_on_a_real_pipeline(
        coco[how],
        original=coco["original"],
        source=FileSource(coco["clip"]),
        labels=labels,
        swap_at=COCO_SWAP_AT,
        min_agreement=min_agreement,
    )
    assert judge.quality is not None and judge.quality.outcome == outcome, judge.quality
    assert words in judge.quality.message
    assert judge.code == (ErrorCode.PROBATION_BLIND if outcome == "blind" else ErrorCode.PROBATION_FAILED)
