"""What a signed desired document asks of a new version's quality (docs/quality.md): a shadow
before the switch (`ShadowRequest`) and probation's quality threshold (`QualityRequest`).

Each key left out takes the device's default from agent.yaml (``deployments.shadow``,
``deployments.quality``). Signed with the rest of the document, so a client on the broker
cannot lower them. Pure values (pydantic models, frozen, unknown keys forbidden).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: the longest a shadow may run, extended or not (seconds)
MAX_SHADOW_S = 86400.0


class _Value(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ShadowRequest(_Value):
    """Run the candidate beside the serving version on live frames before it switches."""

    duration_s: float | None = Field(
        default=None, gt=0, le=MAX_SHADOW_S, description="Seconds to compare (or frames: whichever ends first)."
    )
    frames: int | None = Field(default=None, ge=1, le=1_000_000, description="Frames to compare on each camera.")
    max_s: float | None = Field(
        default=None, gt=0, le=MAX_SHADOW_S, description="Longest a quiet shadow is extended (default 4 x duration_s)."
    )
    min_agreement: float | None = Field(
        default=None, ge=0, le=1, description="Agreement below which the candidate disagrees (0..1)."
    )
    mode: Literal["gate", "report"] | None = Field(
        default=None, description="gate: reject a candidate that disagrees; report: record and switch."
    )
    quiet: Literal["pass", "fail"] | None = Field(
        default=None, description="How a shadow with too few detections to compare ends."
    )

    @model_validator(mode="after")
    def _has_an_end(self) -> ShadowRequest:
        if self.duration_s is None and self.frames is None:
            raise ValueError("a shadow needs duration_s or frames")
        if self.max_s is not None and self.duration_s is not None and self.max_s < self.duration_s:
            raise ValueError(f"max_s ({self.max_s:g}) is shorter than duration_s ({self.duration_s:g})")
        return self


class QualityRequest(_Value):
    """Probation's quality check for this deployment."""

    min_ratio: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Confident detections per frame the new version must keep, as a fraction of the previous "
        "version's just before the swap (0: no quality check).",
    )
    min_agreement: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Agreement with the previous version, run beside the new one on the same frames through "
        "probation, the new version must reach (0: not compared).",
    )
