"""`scripts/redteam.py --quick --json`: every attack of the red team's list is defended on a live daemon."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from testkit import REPO

SCRIPT = REPO / "scripts" / "redteam.py"


def _attack_names() -> set[str]:
    spec = importlib.util.spec_from_file_location("redteam", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["redteam"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return {a.__name__ for a in module.ATTACKS}


@pytest.mark.long(seconds=100)
def test_every_attack_of_the_red_team_list_is_defended() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=420,  # read_only_state_dir's second agent adds about 50 s; 271 s in all on a loaded machine
    )
    results = json.loads(run.stdout)["results"]
    assert set(results) == _attack_names() | {"daemon_survived"}, run.stderr[-2000:]
    failed = {name: r["detail"] for name, r in results.items() if not r["ok"]}
    assert not failed and run.returncode == 0, failed
