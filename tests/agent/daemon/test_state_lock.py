"""`agent.daemon.state_lock.StateDirLock`: one daemon per state directory, shown with real
``edge-agent run`` processes and with `Agent` instances."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from testkit import REPO
from testkit.agent_process import AgentProcess
from testkit.net import wait_until

from agent.config.models import AgentConfig
from agent.daemon.agent import Agent
from agent.daemon.state_lock import StateDirLock
from agent.errors import ConfigError
from agent.hardware.board import probe


def write_config(folder: Path, state_dir: Path) -> Path:
    """An agent.yaml without a broker: one synthetic camera, `state_dir`."""
    path = folder / "agent.yaml"
    config = {
        "device": {"id": "lock-1"},
        "state_dir": str(state_dir),
        "allow_unsigned": True,
        "cameras": [{"name": "cam0", "source": "synthetic", "max_fps": 5}],
    }
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    return path


def run_once(config: Path) -> subprocess.CompletedProcess[str]:
    """``edge-agent run`` that is expected to end by itself (60 s at most)."""
    command = [sys.executable, "-m", "agent.cli", "run", "--config", str(config)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_a_second_daemon_on_the_same_state_directory_exits_naming_the_lock_and_its_holder(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = AgentProcess(write_config(tmp_path / "one", state)).start()
    try:
        assert first.process is not None
        wait_until(lambda: "running as lock-1" in first.output(), 60, "the first daemon to run")
        second = run_once(write_config(tmp_path / "two", state))
        assert second.returncode == 1, second.stderr
        assert second.stderr.strip().splitlines()[-1] == (
            f"edge-agent: error: the state directory {state} is in use: another edge-agent "
            f"(PID {first.process.pid}) holds {state / 'agent.lock'}; "
            "stop it first, or give this agent its own state_dir"
        )
        assert first.alive()
        first.kill()  # the kernel lets go of the lock, the file with the dead PID stays
        assert (state / "agent.lock").read_text().strip() == str(first.process.pid)
        again = AgentProcess(write_config(tmp_path / "three", state)).start()
        try:
            wait_until(lambda: "running as lock-1" in again.output(), 60, "a daemon after the first was killed")
        finally:
            assert again.stop() == 0
        assert again.process is not None and (state / "agent.lock").read_text().strip() == str(again.process.pid)
    finally:
        if first.alive():
            first.stop()


def agent_on(state: Path) -> Agent:
    config = AgentConfig.model_validate(
        {"device": {"id": "lock-2"}, "state_dir": str(state), "allow_unsigned": True, "cameras": []}
    )
    return Agent(config, probe())


def test_the_lock_is_held_from_start_to_stop_and_across_a_reload(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first, second = agent_on(state), agent_on(state)
    first.start()
    try:
        with pytest.raises(ConfigError, match=r"is in use: another edge-agent \(PID \d+\) holds"):
            second.start()
        config = write_config(tmp_path, state)
        first.config_path = config
        first.reload()  # same state directory: the lock is kept, not taken again
        assert first.config.cameras[0].name == "cam0", "the reload applied"
        with pytest.raises(ConfigError, match="is in use"):
            StateDirLock(state).acquire()
        elsewhere = tmp_path / "other"
        elsewhere.mkdir()
        holder = StateDirLock(elsewhere).acquire()
        write_config(tmp_path, elsewhere)
        first.reload()  # a state directory another daemon holds: refused, the running config kept
        assert first.config.state_dir == state
        holder.release()
        first.reload()  # now free: the agent moves there and lets go of the old one
        assert first.config.state_dir == elsewhere
        StateDirLock(state).acquire().release()
    finally:
        first.stop()
    second.start()  # the first let go at its stop
    second.stop()
