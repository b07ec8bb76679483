"""The agent's own version switch: the launcher's choice, the start counter, the probation and
a SIGKILL at every step of a switch or a rollback (docs/fleet.md#agent-updates). The
environments are folders with a ``bin/edge-agent``: what is tested is which one runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.deployment.agent_switch import INSTALLED_MARK, MAX_STARTS, AgentDirs, AgentWatch, Probation, launch


def make_env(path: Path) -> Path:
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "edge-agent").write_text("#!/bin/sh\n")
    (path / INSTALLED_MARK).write_text("whole\n")
    return path


@pytest.fixture
def dirs(tmp_path: Path) -> AgentDirs:
    dirs = AgentDirs(tmp_path / "state", make_env(tmp_path / "base"))
    for version in ("1.0.1", "1.0.2"):
        make_env(dirs.root / version)
    return dirs


def runs(dirs: AgentDirs, running: Path | None = None, launched: bool = False) -> Path:
    """The environment that ends up running when `running` (the base) starts."""
    running = running or dirs.base
    return launch(dirs, running, launched) or running


def test_a_fresh_device_runs_the_installed_environment(dirs: AgentDirs) -> None:
    assert launch(dirs, dirs.base, launched=False) is None
    assert not dirs.record_path.exists()


def test_a_switch_runs_the_new_version_and_a_confirmed_one_stays(dirs: AgentDirs) -> None:
    dirs.switch("1.0.1")
    assert runs(dirs) == dirs.root / "1.0.1"
    assert launch(dirs, dirs.root / "1.0.1", launched=True) is None, "the new one runs itself, no loop"
    dirs.confirm()
    for _ in range(MAX_STARTS + 2):
        assert runs(dirs) == dirs.root / "1.0.1"
    assert dirs.record() is not None and dirs.record().state == "confirmed"  # type: ignore[union-attr]


def test_a_version_that_never_confirms_is_switched_back_after_max_starts(dirs: AgentDirs) -> None:
    dirs.switch("1.0.1")
    dirs.confirm()
    dirs.switch("1.0.2")  # the updater's exec is start 1
    for start in range(2, MAX_STARTS + 1):
        assert runs(dirs) == dirs.root / "1.0.2", f"start {start} still tries it"
    assert runs(dirs) == dirs.root / "1.0.1", "one start more: back to the previous version"
    record = dirs.record()
    assert record is not None and record.state == "rolled_back" and "1.0.2" in record.reason
    assert runs(dirs) == dirs.root / "1.0.1", "and it stays there"


def test_a_launched_start_is_not_counted_twice(dirs: AgentDirs) -> None:
    dirs.switch("1.0.1")
    for _ in range(MAX_STARTS + 2):
        assert launch(dirs, dirs.root / "1.0.1", launched=True) is None
    assert dirs.record().starts == 1  # type: ignore[union-attr]


def test_the_first_version_rolls_back_to_the_installed_environment(dirs: AgentDirs) -> None:
    dirs.switch("1.0.1")
    for _ in range(MAX_STARTS):
        runs(dirs)
    assert runs(dirs) == dirs.base
    assert not dirs.current.exists()


def test_a_symlink_to_a_version_that_is_gone_or_unfinished_runs_the_installed_environment(dirs: AgentDirs) -> None:
    dirs.point("9.9.9")
    assert runs(dirs) == dirs.base
    dirs.current.unlink()
    dirs.current.symlink_to(dirs.root / "1.0.1")  # not a version's name: an absolute path
    assert dirs.current_version() is None and runs(dirs) == dirs.base
    (dirs.root / "1.0.2" / INSTALLED_MARK).unlink()  # killed mid-install
    dirs.point("1.0.2")
    assert runs(dirs) == dirs.base
    assert AgentWatch(dirs, dirs.base, None).restart(lambda: True, 0.0) is False


def test_an_unreadable_record_leaves_the_symlink_in_charge(dirs: AgentDirs) -> None:
    dirs.switch("1.0.1")
    dirs.record_path.write_bytes(b"{" * 10_000)
    assert runs(dirs) == dirs.root / "1.0.1"


def test_probation_confirms_when_healthy_and_rolls_back_after_the_limit(dirs: AgentDirs) -> None:
    dirs.switch("1.0.1")
    assert Probation.for_running(dirs, dirs.base, 0.0) is None, "only the pending version is on probation"
    probation = Probation.for_running(dirs, dirs.root / "1.0.1", started=100.0)
    assert probation is not None
    assert probation.tick(False, 100.0 + probation.within_s - 0.01) is None
    assert probation.tick(True, 100.0 + probation.within_s - 0.01) == "confirmed"
    assert dirs.record().state == "confirmed"  # type: ignore[union-attr]

    dirs.switch("1.0.2")
    probation = Probation.for_running(dirs, dirs.root / "1.0.2", started=0.0)
    assert probation is not None
    watch = AgentWatch(dirs, dirs.root / "1.0.2", probation)
    assert watch.restart(lambda: False, probation.within_s - 0.01) is False
    assert watch.restart(lambda: False, probation.within_s) is True
    assert dirs.current_version() == "1.0.1" and dirs.record().state == "rolled_back"  # type: ignore[union-attr]


def test_the_running_agent_restarts_when_current_names_another_version(dirs: AgentDirs) -> None:
    watch = AgentWatch(dirs, dirs.base, None)
    assert watch.restart(lambda: True, 0.0) is False
    dirs.switch("1.0.1")
    assert watch.restart(lambda: True, 0.0) is True


KILLER = """
import os, signal, sys
from pathlib import Path
from agent.deployment.agent_switch import AgentDirs
dirs = AgentDirs(Path(sys.argv[1]), Path(sys.argv[2]))
def step(name):
    if name == sys.argv[4]:
        os.kill(os.getpid(), signal.SIGKILL)
if sys.argv[3] == "switch":
    dirs.switch("1.0.2", on_step=step)
else:
    dirs.roll_back(dirs.record(), "test", on_step=step)
"""


def kill_at(dirs: AgentDirs, action: str, step: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [sys.executable, "-c", KILLER, str(dirs.root.parent), str(dirs.base), action, step]
    return subprocess.run(args, env=env, check=False).returncode


@pytest.mark.parametrize("step", ["record", "symlink", "switched", "never"])
def test_sigkill_at_each_step_of_a_switch_ends_on_one_whole_version(dirs: AgentDirs, step: str) -> None:
    dirs.switch("1.0.1")
    dirs.confirm()
    returncode = kill_at(dirs, "switch", step)
    assert returncode == (0 if step == "never" else -signal.SIGKILL)
    first = runs(dirs)
    assert first in (dirs.root / "1.0.1", dirs.root / "1.0.2")
    if first == dirs.root / "1.0.1":  # the switch never happened: nothing is on trial
        assert dirs.record().state != "pending"  # type: ignore[union-attr]
    for _ in range(MAX_STARTS + 1):  # the new one never confirms: it ends on the old one
        last = runs(dirs)
    assert last == dirs.root / "1.0.1"
    record = dirs.record()
    assert record is not None and record.state != "pending" and dirs.current_version() == "1.0.1"


@pytest.mark.parametrize("step", ["symlink", "record", "never"])
def test_sigkill_at_each_step_of_a_rollback_ends_on_the_previous_version(dirs: AgentDirs, step: str) -> None:
    dirs.switch("1.0.1")
    dirs.confirm()
    dirs.switch("1.0.2")
    kill_at(dirs, "rollback", step)
    for _ in range(MAX_STARTS + 1):
        last = runs(dirs)
    assert last == dirs.root / "1.0.1" and dirs.record().state == "rolled_back"  # type: ignore[union-attr]


def test_prune_keeps_the_way_back_and_removes_the_rest(dirs: AgentDirs) -> None:
    make_env(dirs.root / "1.0.0")
    dirs.switch("1.0.1")
    dirs.confirm()
    dirs.switch("1.0.2")
    assert dirs.prune(keep="1.0.3") == ["1.0.0"]
    assert sorted(p.name for p in dirs.root.iterdir()) == ["1.0.1", "1.0.2", "current", "switch.json"]


@pytest.mark.parametrize(
    ("installed", "runs_base"),
    [("1.0.2", True), ("2.0.0", True), ("1.0.1", False), ("1.0.0", False), (None, False)],
)
def test_an_installed_environment_upgraded_in_place_runs_over_an_older_switched_version(
    dirs: AgentDirs, installed: str | None, runs_base: bool
) -> None:
    """install.sh --from a newer wheel (or pip) upgrades the installed environment itself: a
    version `current` names that is older than it gives way, never one that is newer or equal."""
    dirs.switch("1.0.1", deployment="d-7")
    dirs.confirm()
    target = launch(dirs, dirs.base, launched=False, installed=installed) or dirs.base
    assert target == (dirs.base if runs_base else dirs.root / "1.0.1")
    record = dirs.record()
    assert record is not None
    if runs_base:
        assert dirs.current_version() is None and record.state == "rolled_back"
        assert (record.version, record.deployment) == ("1.0.1", "d-7") and f"{installed} was installed" in record.reason
        assert runs(dirs) == dirs.base, "and it stays there"
    else:
        assert dirs.current_version() == "1.0.1" and record.state == "confirmed"


def test_an_upgrade_in_place_during_a_pending_switch_ends_it_rolled_back(dirs: AgentDirs) -> None:
    dirs.switch("1.0.1")
    assert launch(dirs, dirs.base, launched=False, installed="1.0.2") is None
    record = dirs.record()
    assert record is not None and record.state == "rolled_back" and dirs.current_version() is None
