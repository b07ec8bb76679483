"""Is a new version seeing what the serving one sees? The judgements of the shadow and of
probation's quality check (docs/quality.md), pure: numbers in, a record out, time injected.

**Shadow** (before the switch): the candidate runs beside the serving version on the cameras'
live frames and `pipelines.measure.comparison.Agreement` compares them per camera. `ShadowJudge`
is fed those reports with the time (clock seconds) and answers None (keep going) or the
`ShadowRecord`:

- the shadow has run its course once `plan.duration_s` passed (or `plan.frames` frames were
  compared on every camera); it goes on, up to `plan.max_s`, while no camera has seen enough
  to judge (`plan.min_detections` detections of either model): a quiet scene is neither a pass
  nor a failure, and at `max_s` it ends ``quiet``, which passes or fails as `plan.quiet` says;
- a camera with enough detections disagrees when its agreement (F1 of the candidate against the
  serving version), or its task measure (mask IoU, keypoints, oriented IoU), is below
  `plan.min_agreement`, or a class the serving version found at least `plan.min_class_detections`
  times agrees below it (two classes swapped show here even where the frame agrees), or, over
  at least `plan.min_class_detections` crops, the second stages' top-1 agreement is;
- ``report`` mode records the outcome and goes on; ``gate`` rejects on ``disagrees``.

**Probation** (after the switch): `judge_rates` compares each camera's confident detections
per frame under the new version with what the previous version saw on it just before the swap
(`pipelines.detection_rates.Rates`). A camera is judged only where the previous version saw at
least `min_before` confident detections and the new one has inferred `MIN_AFTER_FRAMES`
frames; it is blind when its rate fell below `min_ratio` of before, or a class judged (the
previous version saw it `MIN_CLASS_BEFORE` times, and at its rate the new version should have
seen it at least `MIN_CLASS_EXPECTED` times) fell below `min_ratio` of its own rate. An empty
scene before the swap judges nothing: it never fails a version. Rates do not see where the boxes
are: when ``min_agreement`` asks, the previous version also runs beside the new one through
probation (the shadow's session, roles reversed) and `judge_agreement` holds the new version to
the shadow's rules against it; `probation_record` joins the two checks into one record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from agent.bundles.record import (
    CameraAgreementRecord,
    CameraRateRecord,
    ClassRateRecord,
    QualityOutcome,
    QualityRecord,
    ShadowOutcome,
    ShadowRecord,
)
from agent.config.models import ShadowSection
from agent.mqtt.quality_request import ShadowRequest
from pipelines.detection_rates import Rates
from pipelines.measure.comparison import AgreementReport

#: the longest a shadow asked for by frames only runs, quiet or not, unless max_s says (seconds)
FRAMES_ONLY_MAX_S = 600.0
#: a quiet shadow is extended up to this many times its duration unless max_s says
MAX_FACTOR = 4.0

#: probation judges a camera once the new version inferred this many frames on it
MIN_AFTER_FRAMES = 30
#: a class is judged on probation once the previous version saw it this often in its window...
MIN_CLASS_BEFORE = 10
#: ... and, at its rate before, the new version should have seen it this often since the swap
MIN_CLASS_EXPECTED = 10

Label = Callable[[int], str | None]


def _no_label(class_id: int) -> str | None:
    return None


def labelled(labels: Sequence[str]) -> Label:
    """A `Label` over a version's labels (index = class id); None for an id it does not have."""
    names = tuple(labels)
    return lambda class_id: names[class_id] if 0 <= class_id < len(names) else None


@dataclass(frozen=True)
class ShadowPlan:
    """What one shadow runs for and holds the candidate to (the signed desired document's
    request over agent.yaml's ``deployments.shadow``): run `duration_s` seconds or until
    `frames` frames were compared on each camera (one of them at least), extend while quiet up
    to `max_s`, then judge; thresholds as the module says."""

    duration_s: float | None
    frames: int | None
    max_s: float
    min_agreement: float
    mode: Literal["gate", "report"] = "gate"
    quiet: Literal["pass", "fail"] = "pass"
    min_detections: int = 30
    min_class_detections: int = 10

    def __post_init__(self) -> None:
        if self.duration_s is None and self.frames is None:
            raise ValueError("a shadow needs a duration or a frame count")
        if not 0 <= self.min_agreement <= 1:
            raise ValueError(f"min_agreement must be within 0..1, got {self.min_agreement}")


def shadow_plan(request: ShadowRequest | None, section: ShadowSection) -> ShadowPlan | None:
    """The shadow a deployment runs: the signed document's `request` over agent.yaml's `section`
    (each key it leaves out), or None when neither asks for one. ``duration_s`` > 0 in agent.yaml
    requires a shadow of at least that long on every deployment; ``max_s`` defaults to
    `MAX_FACTOR` x the duration (`FRAMES_ONLY_MAX_S` for a shadow by frames only)."""
    if request is None and section.duration_s <= 0:
        return None
    durations = [d for d in (request.duration_s if request else None, section.duration_s) if d]
    duration = max(durations) if durations else None
    frames = request.frames if request else None
    max_s = (request.max_s if request else None) or section.max_s
    if max_s is None:
        max_s = MAX_FACTOR * duration if duration is not None else FRAMES_ONLY_MAX_S
    return ShadowPlan(
        duration_s=duration,
        frames=frames,
        max_s=max(max_s, duration or 0.0),
        min_agreement=section.min_agreement
        if request is None or request.min_agreement is None
        else request.min_agreement,
        mode=section.mode if request is None or request.mode is None else request.mode,
        quiet=section.quiet if request is None or request.quiet is None else request.quiet,
        min_detections=section.min_detections,
    )


def agreement_record(camera: str, report: AgreementReport, label: Label = _no_label) -> CameraAgreementRecord:
    """One camera's `AgreementReport` as the deployment record keeps it (rounded): the one
    conversion, `CameraAgreementRecord.of`, which ``edge-agent bench --against`` shares."""
    return CameraAgreementRecord.of(camera, report, label)


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


class ShadowJudge:
    """Judges one shadow that started at `start` (clock seconds); `label` names a class id.
    `candidate` and `reference` name the two versions in its messages: probation's agreement
    check judges the new version against the previous one with it (`judge_agreement`)."""

    def __init__(
        self,
        plan: ShadowPlan,
        start: float,
        label: Label = _no_label,
        candidate: str = "the candidate",
        reference: str = "the serving version",
    ) -> None:
        self.plan, self.start, self.label = plan, start, label
        self.candidate, self.reference = candidate, reference

    def observe(self, reports: Mapping[str, AgreementReport], now: float) -> ShadowRecord | None:
        """The shadow's record once it is over, else None (keep comparing)."""
        elapsed = now - self.start
        if not self._ran_its_course(reports, elapsed):
            return None
        if not self._judged(reports) and elapsed < self.plan.max_s:
            return None  # a quiet scene: go on comparing
        return self.verdict(reports, elapsed)

    def _judged(self, reports: Mapping[str, AgreementReport]) -> dict[str, AgreementReport]:
        """The cameras that saw enough to judge."""
        return {name: r for name, r in reports.items() if max(r.serving, r.candidate) >= self.plan.min_detections}

    def verdict(self, reports: Mapping[str, AgreementReport], elapsed: float) -> ShadowRecord:
        """The record of `reports` as they stand after `elapsed` seconds, whatever the time
        rules say (``bench --against`` judges a whole clip with it)."""
        judged = self._judged(reports)
        cameras = tuple(agreement_record(name, r, self.label) for name, r in sorted(reports.items()))
        if not judged:
            seen = ", ".join(f"{c.camera}: {max(c.serving, c.candidate)}" for c in cameras) or "no camera"
            frames = max((c.frames for c in cameras), default=0)
            message = (
                f"too few detections to compare in {elapsed:.0f} s and {frames} frames (at least "
                f"{self.plan.min_detections} needed on a camera; {seen}); a quiet comparison "
                f"{'passes' if self.plan.quiet == 'pass' else 'fails'} as asked"
            )
            return self._record("quiet", elapsed, message, cameras)
        problems = [p for name, report in sorted(judged.items()) for p in self._problems(name, report)]
        if problems:
            return self._record("disagrees", elapsed, "; ".join(problems), cameras)
        summary = ", ".join(f"{name} {r.agreement:.2f}" for name, r in sorted(judged.items()))
        least = self.plan.min_agreement
        message = f"{self.candidate} agrees with {self.reference} (agreement {summary}; minimum {least:g})"
        return self._record("agrees", elapsed, message, cameras)

    def progress(self, reports: Mapping[str, AgreementReport], now: float) -> ShadowRecord:
        """The shadow while it runs (outcome ``running``): the numbers so far, for the record
        published meanwhile."""
        elapsed = now - self.start
        cameras = tuple(agreement_record(name, r, self.label) for name, r in sorted(reports.items()))
        frames = ", ".join(f"{c.camera}: {c.frames}" for c in cameras) or "no camera yet"
        message = f"comparing for {elapsed:.0f} s (frames {frames})"
        return self._record("running", elapsed, message, cameras)

    def _ran_its_course(self, reports: Mapping[str, AgreementReport], elapsed: float) -> bool:
        if elapsed >= self.plan.max_s:
            return True
        if self.plan.duration_s is not None and elapsed >= self.plan.duration_s:
            return True
        frames = self.plan.frames
        return frames is not None and bool(reports) and all(r.frames >= frames for r in reports.values())

    def _problems(self, name: str, report: AgreementReport) -> list[str]:
        """Why camera `name` disagrees (empty: it agrees)."""
        least, problems = self.plan.min_agreement, []
        if report.agreement < least:
            problems.append(
                f"camera {name}: agreement {report.agreement:.2f} < {least:g} (precision {report.precision:.2f}, "
                f"recall {report.recall:.2f} against {self.reference} over {report.frames} frames; "
                f"{report.candidate} detections against {report.serving})"
            )
        if report.task_score is not None and report.task_score < least:
            problems.append(f"camera {name}: {report.task} agreement {report.task_score:.2f} < {least:g}")
        if report.top1 is not None and report.crops >= self.plan.min_class_detections and report.top1 < least:
            problems.append(
                f"camera {name}: the second stage's top-1 agreement {report.top1:.2f} < {least:g} "
                f"({report.crops_agreeing} of {report.crops} crops named alike)"
            )
        for c in report.classes:
            if c.serving >= self.plan.min_class_detections and c.agreement < least and report.agreement >= least:
                name_of = self.label(c.class_id) or f"class {c.class_id}"
                problems.append(
                    f"camera {name}: {name_of} agreement {c.agreement:.2f} < {least:g} "
                    f"({c.matched} of {c.serving} matched, {self.candidate} found {c.candidate})"
                )
        return problems

    def _record(
        self, outcome: ShadowOutcome, elapsed: float, message: str, cameras: tuple[CameraAgreementRecord, ...]
    ) -> ShadowRecord:
        return ShadowRecord(outcome, self.plan.mode, self.plan.min_agreement, round(elapsed, 1), message, cameras)


def passes(record: ShadowRecord, quiet: Literal["pass", "fail"]) -> bool:
    """Whether the deployment goes on after the shadow `record` (``report`` mode always does)."""
    if record.mode == "report" or record.outcome == "agrees":
        return True
    return record.outcome == "quiet" and quiet == "pass"


def judge_rates(
    before: Mapping[str, Rates],
    after: Mapping[str, Rates],
    min_ratio: float,
    min_before: int,
    label: Label = _no_label,
) -> QualityRecord:
    """Probation's quality check over each camera in `after` that has a `before`."""
    cameras, problems = [], []
    for name, now in sorted(after.items()):
        then = before.get(name)
        if then is None:
            continue  # a camera the previous version did not serve
        judged = then.count >= min_before and now.frames >= MIN_AFTER_FRAMES
        ratio = now.per_frame() / then.per_frame() if judged else None
        classes = []
        for class_id in sorted(set(then.classes) | set(now.classes)):
            was, rate = then.per_frame(class_id), now.per_frame(class_id)
            old, new = then.classes.get(class_id), now.classes.get(class_id)
            class_ratio = rate / was if was else None
            classes.append(
                ClassRateRecord(
                    class_id=class_id,
                    label=label(class_id),
                    before_per_min=_per_min(old.count if old else 0, then.seconds),
                    after_per_min=_per_min(new.count if new else 0, now.seconds),
                    before_confidence=round(old.mean_confidence, 3) if old else 0.0,
                    after_confidence=round(new.mean_confidence, 3) if new else 0.0,
                    ratio=_rounded(class_ratio, 3),
                )
            )
            often = judged and old is not None and old.count >= MIN_CLASS_BEFORE
            if often and was * now.frames >= MIN_CLASS_EXPECTED and class_ratio is not None and class_ratio < min_ratio:
                name_of = label(class_id) or f"class {class_id}"
                problems.append(
                    f"camera {name}: {name_of} seen {rate:.3f} times a frame, {class_ratio:.2f} x the {was:.3f} "
                    f"of the previous version (minimum {min_ratio:g})"
                )
        if ratio is not None and ratio < min_ratio:
            problems.insert(
                0,
                f"camera {name}: {now.count} confident detections in {now.frames} frames "
                f"({now.per_frame():.3f} a frame), {ratio:.2f} x the {then.per_frame():.3f} of the previous "
                f"version (minimum {min_ratio:g})",
            )
        cameras.append(
            CameraRateRecord(
                name,
                then.frames,
                now.frames,
                round(then.per_frame(), 4),
                round(now.per_frame(), 4),
                _rounded(ratio, 3),
                tuple(classes),
            )
        )
    if problems:
        return QualityRecord("blind", min_ratio, "; ".join(problems), tuple(cameras))
    if not any(c.ratio is not None for c in cameras):
        message = (
            f"the previous version saw too little to judge (fewer than {min_before} confident detections "
            "on every camera just before the swap)"
        )
        return QualityRecord("quiet", min_ratio, message, tuple(cameras))
    summary = ", ".join(f"{c.camera} {c.ratio:.2f}" for c in cameras if c.ratio is not None)
    message = f"the new version sees what the previous one saw ({summary})"
    return QualityRecord("kept", min_ratio, message, tuple(cameras))


def judge_agreement(
    reports: Mapping[str, AgreementReport],
    elapsed: float,
    min_agreement: float,
    min_detections: int,
    label: Label = _no_label,
) -> ShadowRecord:
    """Probation's agreement check: the new version (the reports' candidate) against the previous
    one on the same frames over `elapsed` seconds, judged as a shadow is (a camera with fewer
    than `min_detections` detections of either is not judged; a quiet comparison passes)."""
    plan = ShadowPlan(elapsed, None, elapsed, min_agreement, "gate", "pass", min_detections)
    return ShadowJudge(plan, 0.0, label, "the new version", "the previous version").verdict(reports, elapsed)


def probation_record(rates: QualityRecord | None, agreement: ShadowRecord | None, min_ratio: float) -> QualityRecord:
    """Probation's quality record from its two checks, either of them off (None; not both):
    ``blind`` when either found the new version blind or disagreeing, else ``kept`` when either
    judged it, else ``quiet``."""
    if rates is None:
        if agreement is None:
            raise ValueError("probation_record needs at least one check")
        rates = QualityRecord("quiet", min_ratio, "")
    disagrees = agreement is not None and agreement.outcome == "disagrees"
    if rates.outcome == "blind" or disagrees:
        outcome: QualityOutcome = "blind"
        said = [rates.message if rates.outcome == "blind" else "", agreement.message if disagrees and agreement else ""]
    else:
        outcome = "kept" if rates.outcome == "kept" or (agreement and agreement.outcome == "agrees") else "quiet"
        said = [rates.message, agreement.message if agreement else ""]
    return replace(rates, outcome=outcome, message="; ".join(m for m in said if m), agreement=agreement)


def _per_min(count: int, seconds: float) -> float:
    return round(count * 60 / seconds, 2) if seconds > 0 else 0.0
