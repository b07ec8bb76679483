"""`scripts/install.sh` in a fake root: install twice then uninstall on a Pi; a Jetson's venv; an
upgrade from a newer wheel over an install a fleet update had switched; the systems the
fleet's issue names (Debian 12, Ubuntu 22.04, Raspberry Pi OS: their /etc/os-release is only
named) and what install.sh refuses before it writes anything (no Python or venv module, a Python
older than 3.10, a 32-bit system)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import site
import subprocess
from pathlib import Path

import pytest
import semver
from testkit import FAKES, REPO
from testkit.wheels import checkout_wheel

import agent
from agent.config.loading import check_config
from agent.deployment.agent_switch import INSTALLED_MARK, AgentDirs, launch

#: the version a fleet update switched to, and the newer one install.sh then installs
FLEET = str(semver.Version.parse(agent.__version__).bump_patch())
NEWER = str(semver.Version.parse(agent.__version__).bump_minor())


#: /etc/os-release of the systems the fleet's issue names (abridged)
DEBIAN_12 = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'
UBUNTU_22_04 = 'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_ID="22.04"\n'
PI_OS = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\nVERSION_ID="12"\n'  # Pi OS says Debian's


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built from a copy: pip builds a folder in place (its ``build/``
    and ``*.egg-info``), so two workers building the checkout itself at once break each other."""
    return checkout_wheel(tmp_path_factory.mktemp("wheel"), agent.__version__)


@pytest.fixture(scope="module")
def newer_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout as the next minor version: an upgrade."""
    return checkout_wheel(tmp_path_factory.mktemp("newer"), NEWER)


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


def board_root(tmp_path: Path, board: str, os_release: str | None = None) -> Path:
    root = tmp_path / f"{board}-root"
    (root / "proc/device-tree").mkdir(parents=True)
    shutil.copy(FAKES / board / "proc/device-tree/model", root / "proc/device-tree/model")
    if os_release is not None:
        (root / "etc").mkdir()
        (root / "etc/os-release").write_text(os_release)
    return root


def lines(path: Path, start: str) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith(start)]


def test_install_twice_then_uninstall_on_a_raspberry_pi(tmp_path: Path, wheel: Path) -> None:
    root = board_root(tmp_path, "rpi5", PI_OS)
    first = install(root, wheel)
    assert "board: rpi (Raspberry Pi 5 Model B Rev 1.0)" in first and "with [rpi]" in first
    assert f"system: Debian GNU/Linux 12 (bookworm), {platform.machine()}, Python 3." in first
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
    root = board_root(tmp_path, "jetson-orin-nano", UBUNTU_22_04)  # JetPack 6 is Ubuntu 22.04
    out = install(root, wheel, "--device-id", "dock-3", "--status-listen", "127.0.0.1:9090")
    assert "board: jetson" in out and "with [jetson]" in out and "system: Ubuntu 22.04.4 LTS" in out
    assert "include-system-site-packages = true" in (root / "opt/edge-agent/venv/pyvenv.cfg").read_text()
    text = (root / "etc/edge-agent/agent.yaml").read_text()
    assert 'id: "dock-3"' in text and 'listen: "127.0.0.1:9090"' in text


#: test doubles of the Python install.sh is given: what each refuses, and the words naming it
REFUSED = {
    "missing": (None, "with its venv module is missing", "apt-get install python3 python3-venv"),
    # Debian's Python without python3-venv: `import ensurepip, venv` fails
    "no-venv": ("*ensurepip*) exit 1;;", "with its venv module is missing", "apt-get install python3 python3-venv"),
    # Debian 11's Python 3.9: older than Ubuntu 22.04's 3.10, the oldest taken
    "3.9": ("*version_info*) exit 1;;", "is older than Python 3.10", ""),
    # the 32-bit Raspberry Pi OS (armhf): ONNX Runtime publishes no wheel for it
    "armv7l": (
        "*platform*) echo armv7l; exit 0;;",
        "this system is armv7l: edge-agent needs a 64-bit one",
        "64-bit Raspberry Pi OS",
    ),
}


@pytest.mark.parametrize("python", REFUSED)
def test_a_python_or_a_system_it_cannot_run_on_is_named_before_anything_is_written(
    tmp_path: Path, wheel: Path, python: str
) -> None:
    """A minimal Debian has no python3 (or no python3-venv), an old one an older Python, a Pi
    may run the 32-bit Pi OS: install.sh names what is wrong and writes nothing.

    Outside --prefix it installs a missing Python itself with apt-get (seen on the booted VM,
    tests/e2e/test_booted_system.py); in a throwaway root it installs nothing on the host.
    """
    case, said, fix = REFUSED[python]
    interpreter = str(tmp_path / f"python-{python}")
    if case is not None:  # a test double: the real python3 but for the answer of the case
        Path(interpreter).write_text(f'#!/bin/sh\ncase "$*" in {case} esac\nexec python3 "$@"\n')
        Path(interpreter).chmod(0o755)
    root = board_root(tmp_path, "rpi5", PI_OS)
    result = subprocess.run(
        [str(REPO / "scripts/install.sh"), "--prefix", str(root), "--from", str(wheel), "--python", interpreter],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert said in result.stderr and fix in result.stderr, result.stderr
    assert not (root / "opt/edge-agent").exists() and not (root / "etc/edge-agent").exists()
    assert not (root / "etc/passwd").exists(), "no user or group made"


def test_install_from_a_newer_wheel_upgrades_in_place_keeping_config_user_unit_and_state(
    tmp_path: Path, wheel: Path, newer_wheel: Path
) -> None:
    root = tmp_path / "debian-root"  # a generic x86 or ARM box: no device tree
    (root / "etc").mkdir(parents=True)
    (root / "etc/os-release").write_text(DEBIAN_12)
    install(root, wheel, "--device-id", "gate-1")
    venv, etc, state = root / "opt/edge-agent/venv", root / "etc/edge-agent", root / "var/lib/edge-agent"
    config = etc / "agent.yaml"
    config.write_text(config.read_text() + "# edited by the technician\n")
    before = {path: path.read_bytes() for path in (config, root / "etc/passwd", root / "etc/group")}
    python = (venv / "bin/python").stat().st_ino
    # a fleet update had switched it to a version between the two (agent/deployment/agent_switch.py)
    dirs = AgentDirs(state, venv)
    (dirs.root / FLEET / "bin").mkdir(parents=True)
    (dirs.root / FLEET / INSTALLED_MARK).write_text(f"{FLEET}\n")
    dirs.switch(FLEET, deployment="d-1")
    dirs.confirm()

    out = install(root, newer_wheel)
    assert f"installed edge-agent {NEWER}" in out and "system: Debian GNU/Linux 12 (bookworm)" in out
    assert "created" not in out and "kept the existing" in out, out
    assert {path: path.read_bytes() for path in before} == before, "agent.yaml, the user and groups as they were"
    assert (venv / "bin/python").stat().st_ino == python, "the venv was made again"
    assert (root / "etc/systemd/system/edge-agent.service").read_text() == (
        REPO / "systemd/edge-agent.service"
    ).read_text()
    assert (root / "etc/systemd/system/multi-user.target.wants/edge-agent.service").is_symlink()
    versions = "import agent, importlib.metadata as m; print(agent.__version__, m.version('edge-agent'))"
    site = subprocess.run(
        [str(venv / "bin/python"), "-c", versions], capture_output=True, text=True, cwd="/", env={}, check=True
    )
    assert site.stdout.split() == [NEWER, NEWER], "the old version replaced, code and metadata"
    assert [p.name for p in venv.glob("lib/python*/site-packages/edge_agent-*.dist-info")] == [
        f"edge_agent-{NEWER}.dist-info"
    ]
    # its first start runs the upgrade, not the older version the fleet had switched to
    assert launch(dirs, venv, launched=False, installed=NEWER) is None
    record = dirs.record()
    assert dirs.current_version() is None and record is not None and record.state == "rolled_back", record
    assert (dirs.root / FLEET).is_dir(), "kept until the next update prunes it"


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
