"""Shadow and probation quality results built by hand (`ShadowRecord`, `QualityRecord`), as the
shadow and probation's quality check leave them in the deployment record: each builder takes the
fields to change."""

from __future__ import annotations

import dataclasses
from typing import Any

from agent.bundles.record import (
    CameraAgreementRecord,
    CameraRateRecord,
    ClassAgreementRecord,
    ClassRateRecord,
    QualityRecord,
    ShadowRecord,
)


def agreement_class(class_id: int, serving: int = 40, matched: int = 38, **changes: Any) -> ClassAgreementRecord:
    candidate = changes.pop("candidate", serving)
    agreement = 2 * matched / (serving + candidate) if serving + candidate else 1.0
    record = ClassAgreementRecord(class_id, f"class{class_id}", serving, candidate, matched, round(agreement, 4), 1.0)
    return dataclasses.replace(record, **changes)


def shadow_camera(name: str = "cam0", agreement: float = 0.95, **changes: Any) -> CameraAgreementRecord:
    record = CameraAgreementRecord(
        camera=name,
        frames=120,
        serving=200,
        candidate=196,
        matched=188,
        precision=0.9592,
        recall=0.94,
        agreement=agreement,
        confident_ratio=0.98,
        serving_ms=12.5,
        candidate_ms=14.25,
        classes=(agreement_class(0), agreement_class(2)),
    )
    return dataclasses.replace(record, **changes)


def shadow(outcome: str = "agrees", **changes: Any) -> ShadowRecord:
    first = 0.31 if outcome == "disagrees" else 0.95
    cameras = changes.pop("cameras", (shadow_camera("cam0", first), shadow_camera("door", 0.91)))
    message = {
        "agrees": "the candidate agrees with the serving version (agreement cam0 0.95, door 0.91; minimum 0.8)",
        "disagrees": "camera cam0: agreement 0.31 < 0.8 (precision 0.90, recall 0.19 against the serving version)",
        "quiet": "too few detections to compare in 600 s",
        "running": "comparing for 20 s of 300 s",
    }[outcome]
    record = ShadowRecord(outcome, "gate", 0.8, 300.0, message, cameras)  # type: ignore[arg-type]
    return dataclasses.replace(record, **changes)


def rate_class(class_id: int, before: float = 30.0, after: float = 29.0, **changes: Any) -> ClassRateRecord:
    ratio = round(after / before, 3) if before else None
    record = ClassRateRecord(class_id, f"class{class_id}", before, after, 0.71, 0.69, ratio)
    return dataclasses.replace(record, **changes)


def rate_camera(name: str = "cam0", ratio: float | None = 0.97, **changes: Any) -> CameraRateRecord:
    record = CameraRateRecord(name, 6000, 600, 1.25, round(1.25 * (ratio or 0), 4), ratio, (rate_class(0),))
    return dataclasses.replace(record, **changes)


def quality(outcome: str = "kept", **changes: Any) -> QualityRecord:
    first = 0.05 if outcome == "blind" else 0.97
    cameras = changes.pop("cameras", (rate_camera("cam0", first), rate_camera("door", 1.02)))
    message = {
        "kept": "the new version sees what the previous one saw (cam0 0.97, door 1.02)",
        "blind": "camera cam0: 40 confident detections in 600 frames (0.067 a frame), 0.05 x the 1.250 of the "
        "previous version (minimum 0.5)",
        "quiet": "the previous version saw too little to judge",
    }[outcome]
    record = QualityRecord(outcome, 0.5, message, cameras)  # type: ignore[arg-type]
    return dataclasses.replace(record, **changes)
