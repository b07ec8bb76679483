"""What a desired document may ask of a new version's quality (`agent.mqtt.quality_request`)."""

from __future__ import annotations

import json

import pytest

from agent.mqtt.protocol import Desired, ProtocolError
from agent.mqtt.quality_request import QualityRequest, ShadowRequest

DOCUMENT = {"id": "d1", "name": "m", "version": "1.0.0", "sha256": "a" * 64, "size": 1, "chunk_size": 1, "chunks": 1}


def test_a_desired_document_carries_its_shadow_and_quality() -> None:
    shadow = {"duration_s": 600, "min_agreement": 0.9, "mode": "gate"}
    payload = DOCUMENT | {"shadow": shadow, "quality": {"min_ratio": 0.4}}
    desired = Desired.parse(json.dumps(payload).encode(), "desired")
    assert desired.shadow == ShadowRequest(duration_s=600, min_agreement=0.9, mode="gate")
    assert desired.quality == QualityRequest(min_ratio=0.4)
    assert b'"shadow"' in desired.canonical_bytes(), "the thresholds are signed with the rest"


@pytest.mark.parametrize(
    ("shadow", "named"),
    [
        ({"min_agreement": 0.8}, "duration_s or frames"),
        ({"duration_s": 0}, "duration_s"),
        ({"duration_s": 60, "min_agreement": 1.2}, "min_agreement"),
        ({"duration_s": 600, "max_s": 60}, "max_s"),
        ({"frames": 10, "mode": "maybe"}, "mode"),
        ({"frames": 10, "threshold": 0.1}, "threshold"),
    ],
)
def test_a_bad_shadow_request_is_refused_naming_the_key(shadow: dict[str, object], named: str) -> None:
    with pytest.raises(ProtocolError, match=named):
        Desired.parse(json.dumps(DOCUMENT | {"shadow": shadow}).encode(), "desired")


def test_a_ratio_outside_0_1_is_refused() -> None:
    with pytest.raises(ProtocolError, match="min_ratio"):
        Desired.parse(json.dumps(DOCUMENT | {"quality": {"min_ratio": -0.1}}).encode(), "desired")
