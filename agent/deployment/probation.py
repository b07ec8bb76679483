"""Probation: is a newly activated version serving as well as the one it replaced?

`ProbationJudge` is pure: the deployer feeds it the cameras' stats once a second with the time
(from an injected clock) and it answers `None` (keep watching), `PASSED`, or the reason the
version failed:

- a camera whose frames keep failing: at least `FAILING_FRAMES` frames failed since the previous
  observation and none succeeded (named as unusable output when the model's output was all NaN
  or could not be decoded: `PipelineStats.bad_outputs`);
- at the end, a camera with more frames of unusable output than frames inferred on the new version;
- at the end, a camera whose source ran but that inferred no frame on the new version;
  counted across a restart of its pipeline (a deployment that moves it between runtimes
  restarts it, and its counters begin again at 0: counters lower than at the previous
  observation are a restart, not frames lost);
- at the end, a camera whose FPS over the second half of the probation stayed below
  `min_fps_ratio` times what the previous version did on it just before the swap (only while
  its source ran and it was not paused; a cap in force now, the governor's, lowers what is
  expected; cameras with no previous FPS are not compared);
- at the end, once all of that passed and `quality` asks for it (`QualityCheck`, min_ratio > 0):
  what the new version saw against what the previous one saw just before the swap
  (`agent.deployment.quality.judge_rates` over `PipelineStats.rates`, docs/quality.md); and
  where `min_agreement` > 0, the new version's detections against the previous version's on the
  same frames through probation (the `agreements` the deployer passes `observe`: the previous
  version run beside the new one, `agent.deployment.quality.judge_agreement`). A blind or
  disagreeing version fails with `code` ``PROBATION_BLIND``; `quality` keeps the record
  whatever the outcome. A camera's rates are the new version's only once it delivered a frame: a camera
  whose rates still hold more frames than it inferred since the swap is left out (they are the
  previous version's); one whose pipeline restarted is judged on what it saw since.

The deployer handles the rest: a rollback command or a stop during probation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from agent.bundles.record import QualityRecord
from agent.config.models import QualitySection
from agent.deployment.quality import judge_agreement, judge_rates, labelled, probation_record
from agent.errors import ErrorCode
from agent.mqtt.quality_request import QualityRequest
from pipelines.detection_rates import Rates
from pipelines.measure.comparison import AgreementReport
from pipelines.pipeline import PipelineStats

PASSED: Final = "passed"
#: failed frames, with none succeeding, that fail a version at once
FAILING_FRAMES = 3


@dataclass(frozen=True)
class QualityCheck:
    """Probation's quality check: the fraction of the previous version's confident detections
    the new one must keep (0: no check), how many detections a camera must have seen for it to
    be judged (the previous version's before the swap; either version's on the frames the
    agreement check compared), the version's labels (index = class id), and the agreement with
    the previous version the new one must reach on the same frames (0: not compared)."""

    min_ratio: float
    min_before: int
    labels: tuple[str, ...] = ()
    min_agreement: float = 0.0

    @classmethod
    def of(cls, request: QualityRequest | None, section: QualitySection, labels: Sequence[str] = ()) -> QualityCheck:
        """The signed desired document's `request` over agent.yaml's ``deployments.quality``."""
        ratio = request.min_ratio if request is not None else None
        agreement = request.min_agreement if request is not None else None
        return cls(
            section.min_ratio if ratio is None else ratio,
            section.min_before,
            tuple(labels),
            section.min_agreement if agreement is None else agreement,
        )

    def label(self, class_id: int) -> str | None:
        return labelled(self.labels)(class_id)


@dataclass
class _Camera:
    baseline_fps: float
    frames_seen: int = 0  # counters at the previous observation (at first: just before the swap)
    errors_seen: int = 0
    bad_seen: int = 0
    bad: int = 0  # frames of unusable output on the new version, across restarts of the pipeline
    inferred: int = 0  # frames inferred on the new version, across restarts of the pipeline
    fps_samples: list[float] = field(default_factory=list)
    ran: bool = False  # its source was running at some point
    rates: Rates | None = None  # what the previous version saw just before the swap


class ProbationJudge:
    """Judges one probation of `duration_s` seconds that started at `start` (clock seconds).

    `before` are the cameras' stats just before the new version was swapped in: their FPS is
    the baseline, their counters the starting point (a swap keeps a pipeline's counters) and
    their rates what the new version's are compared with when `quality` is given. After a
    verdict, `code` is the error code a failure ends with and `quality` the quality check's
    record (None: not judged, as the other checks failed or `quality` is off).
    """

    def __init__(
        self,
        before: Sequence[PipelineStats],
        start: float,
        duration_s: float,
        min_fps_ratio: float,
        quality: QualityCheck | None = None,
    ) -> None:
        self.start, self.duration_s, self.min_fps_ratio = start, duration_s, min_fps_ratio
        self._check = quality
        self._cameras: dict[str, _Camera] = {
            s.name: _Camera(0.0 if s.paused else s.fps, s.frames, s.errors, s.bad_outputs, rates=s.rates)
            for s in before
        }
        self.code = ErrorCode.PROBATION_FAILED
        self.quality: QualityRecord | None = None

    def observe(
        self,
        stats: Sequence[PipelineStats],
        now: float,
        agreements: Mapping[str, AgreementReport] | None = None,
    ) -> str | None:
        """`PASSED`, the reason the version failed, or None to keep watching. `agreements`: the
        new version against the previous one on each camera so far (None: not compared)."""
        elapsed = now - self.start
        for s in stats:
            camera = self._cameras.setdefault(s.name, _Camera(0.0))  # a camera started by the new version
            failed, succeeded = s.errors - camera.errors_seen, s.frames - camera.frames_seen
            bad = s.bad_outputs - camera.bad_seen
            if failed < 0 or succeeded < 0 or bad < 0:  # the pipeline restarted: its counters began again at 0
                failed, succeeded, bad = s.errors, s.frames, s.bad_outputs
            camera.frames_seen, camera.errors_seen, camera.bad_seen = s.frames, s.errors, s.bad_outputs
            camera.inferred += succeeded
            camera.bad += bad
            camera.ran = camera.ran or s.source_status.state == "running"
            if bad >= FAILING_FRAMES and succeeded <= 0:
                return (
                    f"camera {s.name}: the model's output was unusable on {bad} frames of the new version and "
                    f"none succeeded ({s.bad_output})"
                )
            if failed >= FAILING_FRAMES and succeeded <= 0:
                return f"camera {s.name}: {failed} frames failed on the new version and none succeeded"
            if elapsed >= self.duration_s / 2 and not s.paused and s.source_status.state == "running":
                camera.fps_samples.append(s.fps)
        if elapsed < self.duration_s:
            return None
        verdict = self._verdict({s.name: s for s in stats})
        return self._judge_quality(stats, agreements, elapsed) if verdict == PASSED else verdict

    def _judge_quality(
        self, stats: Sequence[PipelineStats], agreements: Mapping[str, AgreementReport] | None, elapsed: float
    ) -> str:
        check = self._check
        if check is None:
            return PASSED
        rates = agreement = None
        if check.min_ratio > 0:
            before, after = {}, {}
            for s in stats:
                camera = self._cameras[s.name]
                if camera.rates is not None and 0 < s.rates.frames <= camera.inferred:  # the new version's
                    before[s.name], after[s.name] = camera.rates, s.rates
            rates = judge_rates(before, after, check.min_ratio, check.min_before, check.label)
        if check.min_agreement > 0 and agreements is not None:
            agreement = judge_agreement(agreements, elapsed, check.min_agreement, check.min_before, check.label)
        if rates is None and agreement is None:
            return PASSED
        self.quality = probation_record(rates, agreement, check.min_ratio)
        if self.quality.outcome != "blind":
            return PASSED
        self.code = ErrorCode.PROBATION_BLIND
        return self.quality.message

    def _verdict(self, stats: Mapping[str, PipelineStats]) -> str:
        for name, camera in self._cameras.items():
            now = stats.get(name)
            if now is None:
                continue  # the camera stopped (a restart, a config reload): nothing to judge
            if camera.ran and camera.inferred <= 0:
                return f"camera {name} inferred no frame on the new version in {self.duration_s:.0f} s"
            if camera.bad > camera.inferred:
                return (
                    f"camera {name}: the model's output was unusable on {camera.bad} frames of the new version, "
                    f"more than the {camera.inferred} it inferred ({now.bad_output})"
                )
            baseline = camera.baseline_fps if now.max_fps is None else min(camera.baseline_fps, now.max_fps)
            if baseline > 0 and camera.fps_samples:
                fps = sum(camera.fps_samples) / len(camera.fps_samples)
                if fps < self.min_fps_ratio * baseline:
                    return (
                        f"camera {name} ran at {fps:.1f} FPS, below {self.min_fps_ratio:g} x the "
                        f"{baseline:.1f} FPS of the previous version"
                    )
        return PASSED
