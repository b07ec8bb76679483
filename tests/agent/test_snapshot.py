"""`agent.snapshot`: health judged from the cameras, the link and the daemon's own loops; each camera's
thresholds in force and motion gate in its entry of the JSON."""

from __future__ import annotations

import pytest
from testkit.snapshots import camera, link, snapshot

from agent.mqtt.link import LinkStats
from agent.snapshot import MotionView, ThresholdsInForce, judge_health
from pipelines.pipeline import PipelineStats
from pipelines.worker import LoopState

SAMPLER = "the sampler (sensors, governor, telemetry)"
COMMANDS = "the commands thread (MQTT commands)"


@pytest.mark.parametrize(
    ("cameras", "broker", "loops", "problems"),
    [
        ((camera(stalled_s=1.0),), link(stalled_s=1.0), (LoopState(SAMPLER, 1.0), LoopState(COMMANDS, 5.0)), []),
        ((camera(stalled_s=9.0), camera("cam1")), None, (LoopState(SAMPLER),), ["camera cam0"]),
        ((), link(stalled_s=30.0), (), ["the MQTT link"]),
        ((), None, (LoopState(SAMPLER, 6.0),), ["the sampler"]),
        ((), None, (LoopState(SAMPLER), LoopState(COMMANDS, 5.1)), ["the commands thread"]),
        ((), None, (LoopState(COMMANDS, ended="RecursionError: too deep"),), ["the commands thread"]),
    ],
)
def test_health(
    cameras: tuple[PipelineStats, ...], broker: LinkStats | None, loops: tuple[LoopState, ...], problems: list[str]
) -> None:
    health = judge_health(cameras, broker, loops, stall_s=5.0)
    assert health.ok is (not problems)
    assert [p.split(":")[0].split(" loop")[0].split("'s")[0].split(" (")[0] for p in health.problems] == problems


def test_a_loop_whose_thread_ended_is_a_problem_at_once_with_why() -> None:
    ended = LoopState(COMMANDS, stalled_s=0.0, ended="RecursionError: maximum recursion depth exceeded")
    health = judge_health((), None, (ended,), stall_s=60.0)
    assert health.problems == (f"{COMMANDS} is not running: RecursionError: maximum recursion depth exceeded",)


def test_each_cameras_thresholds_go_into_its_entry_of_the_json() -> None:
    import json

    door = ThresholdsInForce("door", 0.5, 0.45, 20, ("person",), ("conf", "max_det", "classes"))
    document = json.loads(json.dumps(snapshot(cameras=(camera(), camera("door")), thresholds=(door,)).to_json()))
    assert "thresholds" not in document, "no list beside the cameras"
    assert [c["name"] for c in document["cameras"]] == ["cam0", "door"]
    assert document["cameras"][0]["thresholds"] is None, "a camera not serving has none in force"
    assert document["cameras"][1]["thresholds"] == {
        "conf": 0.5,
        "iou": 0.45,
        "max_det": 20,
        "classes": ["person"],
        "configured": ["conf", "max_det", "classes"],
        "problems": [],
    }


def test_a_gated_cameras_motion_goes_into_its_entry_of_the_json_and_an_ungated_one_has_null() -> None:
    import json

    door = MotionView(
        "door", ((10.0, 20.0, 50.5, 80.0),), (((0.0, 0.0), (9.0, 0.0), (9.0, 9.0)),), 0.02, False, 0.4, 0.3
    )
    document = json.loads(json.dumps(snapshot(cameras=(camera(), camera("door")), motion=(door,)).to_json()))
    assert "motion" not in document, "no list beside the cameras"
    assert document["cameras"][0]["motion"] is None, "a camera without a gate draws nothing"
    assert document["cameras"][1]["motion"] == {
        "regions": [[10.0, 20.0, 50.5, 80.0]],
        "masks": [[[0.0, 0.0], [9.0, 0.0], [9.0, 9.0]]],
        "changed": 0.02,
        "recalibrated": False,
        "inferred_ratio": 0.4,
        "motion_ratio": 0.3,
    }
    assert document["cameras"][0]["thresholds"] is None, "and the thresholds still go beside it"


def test_the_json_carries_each_cameras_detection_rates_and_the_deployments_quality() -> None:
    """A camera's rates keep their classes in a read-only mapping (`pipelines.detection_rates`):
    /api/status once answered 500 on every snapshot since they were added."""
    import json
    from types import MappingProxyType

    from testkit.quality_records import quality, shadow

    from agent.bundles.record import State
    from agent.snapshot import DeploymentStatus
    from pipelines.detection_rates import ClassRate, Rates

    rates = Rates(frames=40, seconds=8.0, classes=MappingProxyType({2: ClassRate(12, 9.0)}))
    judged = DeploymentStatus("d", "demo", "2.0.0", "a" * 64, State.SUCCEEDED, None, 1, None, shadow(), quality())
    document = json.loads(json.dumps(snapshot(cameras=(camera(rates=rates),), deployment=judged).to_json()))
    assert document["cameras"][0]["rates"]["classes"] == {"2": {"count": 12, "confidence_sum": 9.0}}
    assert document["deployment"]["shadow"]["cameras"][0]["agreement"] == 0.95
    assert document["deployment"]["quality"]["outcome"] == "kept"
