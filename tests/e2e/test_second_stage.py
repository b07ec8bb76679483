"""End to end: a signed two-stage bundle (the demo detector, then the demo classifier on squares and
triangles) pushed to an agent process over a real mosquitto; its object events carry the class."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from testkit import DEMO_MODELS
from testkit.broker import Broker, Watcher
from testkit.fleet import finished, online, push, serving
from testkit.net import wait_until

from agent.bundles.archive import ClassifierInput, build_bundle
from agent.bundles.signing import load_private_key
from pipelines.sources.synthetic import CLASS_NAMES

pytestmark = pytest.mark.usefixtures("operator_key")


def test_the_events_of_a_two_stage_bundle_carry_the_class(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    broker: Broker,
    watcher: Watcher,
    agents: Any,
    keys: dict[str, Path],
) -> None:
    bundle = tmp_path / "two-stage.bundle"
    stage = ClassifierInput(
        (DEMO_MODELS / "demo_classify.onnx",), tuple(CLASS_NAMES), for_labels=("square", "triangle"), every_s=1.0
    )
    key = load_private_key(keys["private"])
    build_bundle(
        [DEMO_MODELS / "demo_detector.onnx"], bundle, name="shapes", version="1.0.0", key=key, classifier=stage
    )
    camera = {"name": "cam0", "source": "tracking:5", "max_fps": 15}
    agents("dev1", cameras=[camera], events={"min_confidence": 0.5, "min_interval_s": 0.5})
    online(watcher, "dev1")
    finished(watcher, "dev1", push(capsys, broker, bundle, "device:dev1"))
    serving(watcher, "dev1", "1.0.0")

    def classified() -> list[Any]:
        events = watcher.all_json("edge/dev1/events")
        found = [e for e in events if e.get("classification")]
        ends = {e["object_id"] for e in found if e["type"] == "end"}
        return found if len(ends) >= 4 else []

    found = wait_until(classified, 180, "the ends of four classified objects")
    events = watcher.all_json("edge/dev1/events")
    assert all(e["label"] in ("square", "triangle") for e in found), "the stage is for squares and triangles only"
    circles = [e for e in events if e.get("label") == "circle"]
    assert all("classification" not in e for e in circles)
    for event in found:
        answer = event["classification"]
        assert set(answer) == {"label", "class_id", "score"} and 0.0 <= answer["score"] <= 1.0
        assert answer["label"] == CLASS_NAMES[answer["class_id"]]
    agree = sum(e["classification"]["label"] == e["label"] for e in found)
    assert agree >= 0.8 * len(found), f"the class is the shape the detector saw: {agree} of {len(found)}"
    status = watcher.json("edge/dev1/status")
    assert status is not None and status["state"] == "online"
