"""`bench/soak.py` in its short form: 48 s of the chaos soak at twice its pace (broker restarts,
a camera fault, a deployment, a rollback, snapshot floods) ends as intended. 48 s, not the minute
it was: the same actions are due (the last, the rollback, at 45 s; the next, a broker restart, at
62.5 s), without the 12 s of cameras inferring after them that no assertion reads; every action
due runs however late a deployment makes it (`soak.slots_due`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from testkit import REPO


@pytest.mark.long(seconds=70)
def test_a_minute_of_chaos_ends_every_deployment_and_rollback_as_intended() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/soak.py", "--minutes", "0.8", "--pace", "2", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    outcomes = report["outcomes"]
    assert [o["action"] for o in outcomes] == ["deploy", "deploy", "rollback"], outcomes
    assert [(o["state"], o["error"]) for o in outcomes] == [
        ("SUCCEEDED", None),  # the warm-up: 1.0.0 on ONNX Runtime
        ("SUCCEEDED", None),  # 1.1.0 on LiteRT, through its probation
        ("ROLLED_BACK", None),  # the rollback command, back to 1.0.0
    ], outcomes
    assert (report["deployments_ok"], report["rollbacks_ok"]) == (2, 1)
    assert report["pings_ok"] == 2, "a signed ping answered after each snapshot flood"
    assert report["broker_restarts"] == 2 and report["tracebacks"] == 0, report
