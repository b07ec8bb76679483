"""`edge-agent rollback`: previous becomes current, recorded as ROLLED_BACK; none to go back to is one line."""

from __future__ import annotations

from pathlib import Path

from testkit.store import A, B, two_versions

from agent.bundles.record import State
from agent.bundles.store import Store
from agent.cli import main


def test_rollback_returns_to_the_previous_version_and_records_it(tmp_path: Path, capsys) -> None:
    store = two_versions(tmp_path)
    assert main(["rollback", "--state-dir", str(store.root)]) == 0
    assert capsys.readouterr().out == f"rolled back to x {A} ({A[:12]})\n"
    after = Store(store.root)
    assert (after.current_sha(), after.previous_sha()) == (A, B)
    last = after.last_deployment()
    assert last is not None and (last.id, last.state, last.sha256) == (f"rollback-{A[:12]}", State.ROLLED_BACK, A)


def test_rollback_without_a_previous_version_fails_as_one_line(tmp_path: Path, capsys) -> None:
    assert main(["rollback", "--state-dir", str(tmp_path / "state")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("edge-agent: error: ") and err.count("\n") == 1
    assert Store(tmp_path / "state").current_sha() is None
