"""`scripts/install.sh` in a fake root: install twice then uninstall on a Pi; a Jetson's venv."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
from pathlib import Path

import pytest
from testkit import FAKES, REPO

from agent.config.loading import check_config


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [str(REPO / ".venv/bin/python"), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(folder), str(REPO)],
        check=True,
        capture_output=True,
    )
    return next(folder.glob("edge_agent-*.whl"))


def install(root: Path, wheel: Path, *args: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": site.getsitepackages()[0],
        "EDGE_AGENT_PIP_ARGS": "--no-deps --no-index",
    }
    result = subprocess.run(
        [str(REPO / "scripts/install.sh"), "--prefix", str(root), "--from", str(wheel), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def board_root(tmp_path: Path, board: str) -> Path:
    root = tmp_path / f"{board}-root"
    (root / "proc/device-tree").mkdir(parents=True)
    shutil.copy(FAKES / board / "proc/device-tree/model", root / "proc/device-tree/model")
    return root


def lines(path: Path, start: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith(start)]


def test_install_twice_then_uninstall_on_a_raspberry_pi(tmp_path: Path, wheel: Path) -> None:
    root = board_root(tmp_path, "rpi5")
    first = install(root, wheel)
    assert "board: rpi (Raspberry Pi 5 Model B Rev 1.0)" in first and "with [rpi]" in first
    venv, etc = root / "opt/edge-agent/venv", root / "etc/edge-agent"
    assert (venv / "bin/edge-agent").is_file()
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    unit = root / "etc/systemd/system/edge-agent.service"
    assert unit.read_text() == (REPO / "systemd/edge-agent.service").read_text()
    wants = root / "etc/systemd/system/multi-user.target.wants/edge-agent.service"
    assert wants.is_symlink() and os.readlink(wants) == "/etc/systemd/system/edge-agent.service"
    assert len(lines(root / "etc/passwd", "edge-agent:")) == 1
    assert "/usr/sbin/nologin" in lines(root / "etc/passwd", "edge-agent:")[0]
    groups = {line.split(":")[0]: line.split(":")[2] for line in (root / "etc/group").read_text().splitlines()}
    assert {"video", "gpio", "i2c", "render", "edge-agent"} <= set(groups)
    config = etc / "agent.yaml"
    assert check_config(config) == [] and config.stat().st_mode & 0o777 == 0o640
    assert str(config.stat().st_gid) == groups["edge-agent"] and (etc.stat().st_mode & 0o777) == 0o750
    text = config.read_text()
    assert 'state_dir: "/var/lib/edge-agent"' in text and 'listen: "127.0.0.1:8080"' in text

    config.write_text(text + "# edited by the technician\n")
    python = (venv / "bin/python").stat().st_ino
    second = install(root, wheel)
    assert "created" not in second and "kept the existing" in second, second
    assert config.read_text().endswith("# edited by the technician\n"), "an existing agent.yaml is never overwritten"
    assert (venv / "bin/python").stat().st_ino == python, "the venv was made again"
    assert len(lines(root / "etc/passwd", "edge-agent:")) == 1 and len(lines(root / "etc/group", "gpio:")) == 1

    state = root / "var/lib/edge-agent"
    (state / "versions").mkdir(parents=True)
    (state / "current").symlink_to("versions/abc")
    out = install(root, wheel, "--uninstall")
    assert "kept the state directory" in out
    assert not (root / "opt/edge-agent").exists() and not etc.exists()
    assert not unit.exists() and not wants.exists()
    assert lines(root / "etc/passwd", "edge-agent:") == []
    assert (state / "current").is_symlink() and (state / "versions").is_dir()


def test_a_jetson_venv_sees_the_system_packages(tmp_path: Path, wheel: Path) -> None:
    root = board_root(tmp_path, "jetson-orin-nano")
    out = install(root, wheel, "--device-id", "dock-3", "--status-listen", "127.0.0.1:9090")
    assert "board: jetson" in out and "with [jetson]" in out
    assert "include-system-site-packages = true" in (root / "opt/edge-agent/venv/pyvenv.cfg").read_text()
    text = (root / "etc/edge-agent/agent.yaml").read_text()
    assert 'id: "dock-3"' in text and 'listen: "127.0.0.1:9090"' in text


@pytest.mark.parametrize("python", ["missing", "no-venv"])
def test_a_system_without_python_or_its_venv_module_is_named(tmp_path: Path, wheel: Path, python: str) -> None:
    """A minimal Debian has no python3 (or no python3-venv): install.sh names what to install.

    Outside --prefix it installs them itself with apt-get (seen on the booted VM,
    tests/e2e/test_booted_system.py); in a throwaway root it installs nothing on the host.
    """
    if python == "missing":
        interpreter = str(tmp_path / "no-such-python3")
    else:  # a test double: a Python whose `import ensurepip, venv` fails, as Debian's without python3-venv
        interpreter = str(tmp_path / "python3-without-venv")
        Path(interpreter).write_text('#!/bin/sh\ncase "$*" in *ensurepip*) exit 1;; esac\nexec python3 "$@"\n')
        Path(interpreter).chmod(0o755)
    result = subprocess.run(
        [
            str(REPO / "scripts/install.sh"),
            "--prefix",
            str(tmp_path / "root"),
            "--from",
            str(wheel),
            "--python",
            interpreter,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert f"install.sh: {interpreter} with its venv module is missing" in result.stderr
    assert "apt-get install python3 python3-venv" in result.stderr
    assert not (tmp_path / "root/opt/edge-agent/venv").exists()


def test_install_with_a_claim_leaves_a_device_that_enrols_on_its_first_start(tmp_path: Path, wheel: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agent.config.loading import load_config
    from agent.daemon.enrol_start import claim_to_use
    from agent.mqtt.enrolment import pem

    root = board_root(tmp_path, "rpi5")
    bad = tmp_path / "bad-claim.json"
    bad.write_text('{"broker": "mqtt://fleet:1883"}')
    result = subprocess.run(
        [str(REPO / "scripts/install.sh"), "--prefix", str(root), "--from", str(wheel), "--claim", str(bad)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": site.getsitepackages()[0], "EDGE_AGENT_PIP_ARGS": "--no-deps --no-index"},
        timeout=300,
    )
    assert result.returncode == 1 and f"install.sh: --claim: the claim {bad}: " in result.stderr, result.stderr
    assert not (root / "etc/edge-agent/agent.yaml").exists() and not (root / "etc/edge-agent/claim.json").exists()

    claim = tmp_path / "claim.json"
    body = {"broker": "mqtt://fleet:1883", "claim": "site-a", "username": "claim-site-a", "password": "p"}
    claim.write_text(
        json.dumps(body | {"operator_keys": [pem(Ed25519PrivateKey.generate().public_key())], "expires_at": 4e9})
    )
    out = install(root, wheel, "--claim", str(claim))
    assert "copied the claim" in out and "enrols on its first start" in out
    etc, state = root / "etc/edge-agent", root / "var/lib/edge-agent"
    user = lines(root / "etc/passwd", "edge-agent:")[0].split(":")
    copied = etc / "claim.json"
    assert copied.read_text() == claim.read_text() and copied.stat().st_mode & 0o777 == 0o600
    assert (str(copied.stat().st_uid), str(copied.stat().st_gid)) == (user[2], user[3])
    link = etc / "agent.yaml"
    assert link.is_symlink() and os.readlink(link) == "/var/lib/edge-agent/agent.yaml"  # the service writes only there
    written = state / "agent.yaml"
    assert written.stat().st_mode & 0o777 == 0o600 and str(written.stat().st_uid) == user[2]
    config = load_config(written)
    assert config.mqtt is None and claim_to_use(config) == Path("/etc/edge-agent/claim.json")

    written.write_text(written.read_text() + "mqtt: {broker: mqtt://fleet:1883}\n")  # as enrolment adds it
    enrolled = written.read_text()
    again = install(root, wheel, "--claim", str(claim))  # the agent.yaml enrolment wrote is never replaced
    assert "kept the existing" in again and written.read_text() == enrolled and link.is_symlink()
