"""End to end over a real mosquitto with the real daemon: a version whose boxes are shifted by a
fifth of the input (its reference outputs made from itself, so it passes parity) pushed with
``--shadow --min-agreement 0.8`` ends REJECTED with SHADOW_DISAGREES while the serving version
keeps serving; the same network as the serving one, re-signed as a newer version, agrees and
switches with its shadow's result in the record. A device's first version switches without one."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import DEMO_MODELS
from testkit.broker import Broker, Watcher
from testkit.bundles import bundle_of, new_version
from testkit.fleet import finished, online, push, serving
from testkit.onnx_models import altered

pytestmark = pytest.mark.usefixtures("operator_key")

SHADOW = ("--shadow", "3s", "--min-agreement", "0.8")


def test_a_shifted_version_is_rejected_by_its_shadow_and_a_good_one_switches(
    capsys, broker: Broker, watcher: Watcher, agents, keys: dict[str, Path], tmp_path: Path
) -> None:
    model = DEMO_MODELS / "demo_detector.onnx"
    first = bundle_of(model, tmp_path / "demo-1.0.0.bundle", keys["private"], version="1.0.0")
    shifted = altered(model, tmp_path / "shifted.onnx", shift=0.2)
    bad = bundle_of(shifted, tmp_path / "demo-1.1.0.bundle", keys["private"], version="1.1.0")
    good = new_version(first, tmp_path / "demo-1.2.0.bundle", keys["private"], "1.2.0")
    agents("dev1", deployments={"probation_s": 0})
    online(watcher, "dev1")
    record = finished(watcher, "dev1", push(capsys, broker, first, "device:dev1", *SHADOW))
    assert record["state"] == "SUCCEEDED" and "shadow" not in record, "a first version has nothing to compare with"
    serving(watcher, "dev1", "1.0.0")

    record = finished(watcher, "dev1", push(capsys, broker, bad, "device:dev1", *SHADOW))
    assert (record["state"], record["error"]["code"]) == ("REJECTED", "SHADOW_DISAGREES"), record
    assert "camera cam0: agreement" in record["error"]["message"] and "< 0.8" in record["error"]["message"]
    assert [h["state"] for h in record["history"]][-3:] == ["ACTIVATING", "SHADOW", "REJECTED"]
    shadow = record["shadow"]
    assert shadow["outcome"] == "disagrees" and shadow["cameras"][0]["agreement"] < 0.8
    assert shadow["cameras"][0]["candidate_ms"] > 0
    assert serving(watcher, "dev1", "1.0.0")["bundle"]["version"] == "1.0.0", "the serving version untouched"

    record = finished(watcher, "dev1", push(capsys, broker, good, "device:dev1", *SHADOW))
    assert record["state"] == "SUCCEEDED", record
    assert record["shadow"]["outcome"] == "agrees" and record["shadow"]["cameras"][0]["agreement"] >= 0.8
    assert "SHADOW" in [h["state"] for h in record["history"]]
    serving(watcher, "dev1", "1.2.0")
