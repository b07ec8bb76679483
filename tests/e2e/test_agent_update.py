"""End to end: the agent updates itself (docs/fleet.md#agent-updates). A throwaway installed
environment runs version A of this checkout over a real mosquitto; ``edge-agent upgrade``
switches it to A+1 (the same code, its version bumped, built as a wheel here), then to an A+2
that raises at import, which is rolled back to A+1 after `MAX_STARTS` starts; a model bundle
pushed afterwards still activates. The same from the fleet: signed agent bundles pushed with
``fleet push --agent`` (an unsigned, a forged and another architecture's refused). The test
restarts the agent when it exits, as systemd's ``Restart=on-failure`` does. A SIGKILL at each
step of a fleet agent deployment (``EDGE_AGENT_KILL_AT``, agent/bundles/installer.py) ends on
one whole version; the switch's own steps alone: test_agent_switch.py."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import sysconfig
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import semver
from testkit.agent_process import agent_config
from testkit.broker import Broker, Watcher
from testkit.fleet import cli, finished, online, push, serving
from testkit.wheels import checkout_wheel

import agent
from agent.bundles.archive import write_tar
from agent.bundles.installer import KILL_HOOK
from agent.cli import main
from agent.deployment.agent_env import BASE_PTH
from agent.deployment.agent_switch import MAX_STARTS, AgentDirs

pytestmark = pytest.mark.usefixtures("operator_key")

A = agent.__version__
A1 = str(semver.Version.parse(A).bump_patch())
A2 = str(semver.Version.parse(A1).bump_patch())


@pytest.fixture(scope="session")
def agent_wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """This checkout as wheels: A, A+1 and an A+2 whose package raises at import (built once
    per session: about 20 s)."""
    folder = tmp_path_factory.mktemp("agent-wheels")
    return {
        version: checkout_wheel(folder, version, broken) for version, broken in ((A, False), (A1, False), (A2, True))
    }


def clean_env() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


class Installed:
    """``edge-agent run`` from the installed environment `base`, restarted when it exits."""

    def __init__(self, base: Path, config: Path, first_env: dict[str, str] | None = None) -> None:
        self.base, self.config, self.log = base, config, config.with_suffix(".log")
        self.exits: list[int] = []
        self.process = self._start(first_env or {})  # `first_env`: the first start's only (a kill hook)

    def _start(self, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            command = [str(self.base / "bin" / "edge-agent"), "-v", "run", "--config", str(self.config)]
            env = {**clean_env(), **(extra or {})}
            return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)

    def supervise(self, done: Callable[[], bool], timeout: float = 120) -> None:
        """Restart the agent each time it exits until `done()` holds (systemd's Restart=)."""
        for _ in range(int(timeout / 0.5)):
            if done():
                return
            try:
                self.exits.append(self.process.wait(0.5))
                self.process = self._start()
            except subprocess.TimeoutExpired:
                pass
        raise AssertionError(f"not done after {timeout} s:\n{self.log.read_text(errors='replace')[-4000:]}")

    def restart(self, status: int) -> None:
        """Start it again after it exited with `status`."""
        self.exits.append(status)
        self.process = self._start()

    def upgrade(self, wheel: Path) -> str:
        command = [str(self.base / "bin" / "edge-agent"), "upgrade", str(wheel), "--config", str(self.config)]
        done = subprocess.run(command, env=clean_env(), capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)


def install_a(tmp_path: Path, broker: Broker, keys: dict[str, Path], wheel: Path, **config: Any) -> Installed:
    """Version A installed as install.sh would: a venv (layered on this test's site-packages for
    the dependencies) with edge-agent's wheel in it, and its agent running (`config`: agent.yaml's
    keys over the test device's)."""
    base = installed_env(tmp_path / "opt" / "venv", wheel)
    return Installed(base, agent_config(tmp_path, broker, "dev1", keys["public"], None, keys["operator_pub"], **config))


def installed_env(base: Path, wheel: Path) -> Path:
    """A venv at `base` (layered on this test's site-packages for the dependencies) with
    edge-agent's `wheel` in it, as install.sh makes it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(base)], check=True)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(base), "platbase": str(base)}))
    (purelib / BASE_PTH).write_text(sysconfig.get_path("purelib") + "\n")
    pip = [str(base / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed"]
    subprocess.run([*pip, str(wheel)], check=True, env=clean_env())
    return base


@pytest.fixture
def installed(
    tmp_path: Path, broker: Broker, keys: dict[str, Path], agent_wheels: dict[str, Path]
) -> Iterator[Installed]:
    """Version A installed and running (`install_a`)."""
    agent = install_a(tmp_path, broker, keys, agent_wheels[A])
    yield agent
    agent.stop()


def switch_state(dirs: AgentDirs) -> str | None:
    record = dirs.record()
    return None if record is None else record.state


@pytest.mark.long(seconds=60)
def test_the_agent_updates_itself_rolls_a_broken_version_back_and_still_deploys_models(
    capsys,
    tmp_path: Path,
    broker: Broker,
    watcher: Watcher,
    installed: Installed,
    agent_wheels: dict[str, Path],
    bundles: dict[str, Path],
) -> None:
    dirs = AgentDirs(tmp_path / "dev1" / "state", installed.base)
    assert online(watcher, "dev1")["agent_version"] == A

    installed.upgrade(agent_wheels[A1])
    watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "online" and d["agent_version"] == A1, 60)
    installed.supervise(lambda: switch_state(dirs) == "confirmed")
    assert installed.exits == [], "the switch to A+1 is an exec, not a crash"
    assert dirs.current_version() == A1 and (dirs.root / A1 / "bin" / "edge-agent").exists()

    installed.upgrade(agent_wheels[A2])
    watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "offline", 30)  # A+1 stopped for A+2
    installed.supervise(lambda: (watcher.json("edge/dev1/status") or {}).get("state") == "online")
    record = dirs.record()
    assert record is not None and record.state == "rolled_back" and record.version == A2, record
    assert watcher.json("edge/dev1/status")["agent_version"] == A1
    assert dirs.current_version() == A1
    assert len(installed.exits) == MAX_STARTS, f"A+2 crashed at each of its {MAX_STARTS} starts, then no more"

    deployment = push(capsys, broker, bundles["v1"], "device:dev1")
    assert finished(watcher, "dev1", deployment)["state"] == "SUCCEEDED"
    serving(watcher, "dev1", "1.0.0")


def agent_bundle(capsys, out: Path, key: Path, wheel: Path, *extra: str) -> Path:
    """`edge-agent bundle build --agent` of one wheel, signed by `key`."""
    status, said = cli(
        capsys, "bundle", "build", "--agent", "--wheel", str(wheel), "--key", str(key), "-o", str(out), *extra
    )
    assert status == 0, said
    return out


def unsigned(bundle: Path, out: Path) -> Path:
    """`bundle` without its manifest.sig (the manifest and wheels as they were)."""
    with tarfile.open(bundle) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.name != "manifest.sig"]  # type: ignore[union-attr]
    write_tar(out, members)
    return out


def pushed_agent(capsys, broker: Broker, watcher: Watcher, bundle: Path) -> dict[str, Any]:
    """Push the agent bundle to dev1 with the CLI; its deployment's record once it ends."""
    return finished(watcher, "dev1", push(capsys, broker, bundle, "device:dev1", "--agent"), timeout=120)


@pytest.mark.long(seconds=75)
def test_a_signed_agent_bundle_pushed_over_mqtt_updates_the_agent_and_a_bad_one_is_refused_or_rolled_back(
    capsys,
    tmp_path: Path,
    broker: Broker,
    watcher: Watcher,
    keys: dict[str, Path],
    agent_wheels: dict[str, Path],
    bundles: dict[str, Path],
) -> None:
    # the device takes unsigned model bundles: an agent bundle is code and must be signed all the same
    installed = install_a(tmp_path, broker, keys, agent_wheels[A], allow_unsigned=True)
    try:
        folder = tmp_path / "out"
        good = agent_bundle(capsys, folder / "a1.bundle", keys["private"], agent_wheels[A1])
        forged = agent_bundle(capsys, folder / "forged.bundle", keys["other"], agent_wheels[A1])
        riscv = agent_bundle(capsys, folder / "riscv.bundle", keys["private"], agent_wheels[A1], "--arch", "riscv64")
        broken = agent_bundle(capsys, folder / "a2.bundle", keys["private"], agent_wheels[A2])
        assert online(watcher, "dev1")["agent_version"] == A
        dirs = AgentDirs(tmp_path / "dev1" / "state", installed.base)
        model = push(capsys, broker, bundles["v1"], "device:dev1")
        assert finished(watcher, "dev1", model)["state"] == "SUCCEEDED"

        for bundle, code in (
            (unsigned(good, folder / "unsigned.bundle"), "SIGNATURE_MISSING"),
            (forged, "UNKNOWN_SIGNER"),
            (riscv, "AGENT_UPDATE_WRONG_ARCHITECTURE"),
        ):
            record = pushed_agent(capsys, broker, watcher, bundle)
            assert (record["state"], record["error"]["code"], record["kind"]) == ("REJECTED", code, "agent"), record
            assert dirs.record() is None and not (dirs.root / A1).exists(), "nothing installed, nothing switched"
        assert "riscv64" in record["error"]["message"] and platform.machine() in record["error"]["message"]

        record = pushed_agent(capsys, broker, watcher, good)
        assert (record["state"], record["version"]) == ("SUCCEEDED", A1), record
        assert watcher.json("edge/dev1/status")["agent_version"] == A1
        assert switch_state(dirs) == "confirmed" and installed.exits == []
        serving(watcher, "dev1", "1.0.0")  # the model bundle survived the update, no deployment needed

        deployment = push(capsys, broker, broken, "device:dev1", "--agent")
        installed.supervise(lambda: (watcher.json("edge/dev1/deployment") or {}).get("state") == "ROLLED_BACK")
        record = watcher.json("edge/dev1/deployment")
        assert record["id"] == deployment and record["version"] == A2, record
        assert record["error"]["code"] == "AGENT_UPDATE_ROLLED_BACK", record
        assert f"{A2} did not confirm within {MAX_STARTS} starts" in record["error"]["message"]
        assert online(watcher, "dev1")["agent_version"] == A1 and dirs.current_version() == A1
        serving(watcher, "dev1", "1.0.0")
    finally:
        installed.stop()


@pytest.fixture(scope="module")
def base_a(tmp_path_factory: pytest.TempPathFactory, agent_wheels: dict[str, Path]) -> Path:
    """Version A's installed environment, shared by the devices of this module (each has its own
    state directory, where its agent versions live; none writes into the base)."""
    return installed_env(tmp_path_factory.mktemp("base-a") / "venv", agent_wheels[A])


@pytest.fixture(scope="module")
def bundle_a1(tmp_path_factory: pytest.TempPathFactory, keys: dict[str, Path], agent_wheels: dict[str, Path]) -> Path:
    """A+1's agent bundle, signed by the device's trusted key (`bundle build --agent`)."""
    out = tmp_path_factory.mktemp("agent-bundle") / "a1.bundle"
    assert (
        main(
            [
                "bundle",
                "build",
                "--agent",
                "--wheel",
                str(agent_wheels[A1]),
                "--key",
                str(keys["private"]),
                "-o",
                str(out),
            ]
        )
        == 0
    )
    return out


#: where ``EDGE_AGENT_KILL_AT`` stops an agent deployment, and how it ends after the restart:
#: before the switch record a crash is an interruption (while verifying or installing retried
#: once, as for a model bundle); a record without its symlink is a switch that never happened;
#: from the symlink on, the new version runs and confirms itself
KILL_STEPS = {
    "agent-verified": ("SUCCEEDED", A1),
    "agent-installed": ("SUCCEEDED", A1),
    "agent-record": ("FAILED", A),
    "agent-symlink": ("ROLLED_BACK", A),
    "agent-switched": ("SUCCEEDED", A1),
    "agent-confirming": ("SUCCEEDED", A1),
}


@pytest.mark.long(seconds=30)
@pytest.mark.parametrize("step", KILL_STEPS)
def test_a_sigkill_at_each_step_of_a_fleet_agent_deployment_ends_on_one_whole_version(
    step: str,
    capsys,
    tmp_path: Path,
    broker: Broker,
    watcher: Watcher,
    keys: dict[str, Path],
    base_a: Path,
    bundle_a1: Path,
    bundles: dict[str, Path],
) -> None:
    config = agent_config(tmp_path, broker, "dev1", keys["public"], None, keys["operator_pub"])
    installed = Installed(base_a, config, first_env={KILL_HOOK: step})
    dirs = AgentDirs(tmp_path / "dev1" / "state", base_a)
    state, version = KILL_STEPS[step]
    try:
        assert online(watcher, "dev1")["agent_version"] == A
        deployment = push(capsys, broker, bundle_a1, "device:dev1", "--agent")
        assert installed.process.wait(120) == -signal.SIGKILL, f"killed at {step}"
        installed.restart(-signal.SIGKILL)  # systemd's Restart=on-failure, without the hook

        def ended() -> bool:
            record = watcher.json("edge/dev1/deployment") or {}
            return record.get("id") == deployment and record.get("state") == state

        installed.supervise(ended)
        record = watcher.json("edge/dev1/deployment")
        assert (record["kind"], record["version"]) == ("agent", A1), record
        assert online(watcher, "dev1")["agent_version"] == version
        switch = dirs.record()
        if version == A1:  # the symlink, the record and a whole environment agree
            assert dirs.current_version() == A1 and dirs.whole(A1), step
            assert switch is not None and (switch.state, switch.version, switch.deployment) == (
                "confirmed",
                A1,
                deployment,
            )
        else:  # the installed environment runs, and no record says otherwise
            assert dirs.current_version() is None, step
            assert switch is None or switch.state == "rolled_back", switch
        assert installed.exits == [-signal.SIGKILL], "one kill, no crash after it"

        model = push(capsys, broker, bundles["v1"], "device:dev1")
        assert finished(watcher, "dev1", model)["state"] == "SUCCEEDED"
        serving(watcher, "dev1", "1.0.0")
    finally:
        installed.stop()
