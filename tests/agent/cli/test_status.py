"""`edge-agent status`: the current and previous versions and the last deployment, as text and JSON."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from testkit import quality_records
from testkit.store import A, B, two_versions

from agent.bundles.record import Deployment, State
from agent.cli import main
from agent.errors import BundleError, ErrorCode


def test_status_of_an_empty_device(tmp_path: Path, capsys) -> None:
    assert main(["status", "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"current": None, "previous": None, "deployment": None}
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    assert capsys.readouterr().out.splitlines() == ["current:   none", "previous:  none"]


def test_status_names_current_previous_and_the_last_deployment(tmp_path: Path, capsys) -> None:
    store = two_versions(tmp_path)
    deployment = Deployment(id="d-7", sha256=B, name="x", version=B)
    deployment = deployment.to(State.FAILED, BundleError(ErrorCode.PARITY_FAILED, "outputs differ"))
    store.record(deployment)
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {store.root}\n")

    assert main(["status", "--config", str(config), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "current": {"name": "x", "version": B, "sha256": B},
        "previous": {"name": "x", "version": A, "sha256": A},
        "deployment": {
            "state": "FAILED",
            "error": {"code": "PARITY_FAILED", "message": "outputs differ"},
            "shadow": None,
            "quality": None,
        },
    }
    assert main(["status", "--config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"current:   x {B} ({B[:12]})",
        f"previous:  x {A} ({A[:12]})",
        f"last:      d-7 FAILED {deployment.error}",
    ]


def test_status_says_what_the_last_version_was_judged_to_see(tmp_path: Path, capsys) -> None:
    """The shadow's and probation's verdicts, as `fleet status` words them, on the device too."""
    store = two_versions(tmp_path)
    judged = dataclasses.replace(
        Deployment(id="d-8", sha256=B, name="x", version=B, state=State.PROBATION).to(State.FAILED, None),
        shadow=quality_records.shadow("agrees"),
        quality=quality_records.quality("blind", cameras=(quality_records.rate_camera(ratio=0.2),)),
    )
    store.record(judged)
    assert main(["status", "--state-dir", str(store.root)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "quality:   shadow agrees 0.91; probation blind 0.20<0.5"
    assert main(["status", "--state-dir", str(store.root), "--json"]) == 0
    deployment = json.loads(capsys.readouterr().out)["deployment"]
    assert deployment["shadow"]["outcome"] == "agrees" and deployment["quality"]["cameras"][0]["ratio"] == 0.2
