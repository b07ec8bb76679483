"""An agent version's environment: checks the wheels of an agent update against this device and
installs them into a new venv beside the running one (docs/fleet.md#agent-updates).

The new venv layers on the installed environment (`base`): a ``.pth`` file puts the base's
site-packages after its own, so only edge-agent's wheel (and any dependency whose version
changed) travels and is installed; every other dependency is the one the base already has,
and ``pip check`` proves the set is whole before anything is switched. pip runs with
``--no-index --no-deps``: nothing is fetched from anywhere, only the given wheels go in. The
venv is made in place (its scripts name their interpreter by its absolute path, so it cannot be
renamed) and marked whole last (`INSTALLED_MARK`, an atomic write); an unmarked folder, left
by a crash mid-install, is never run and is made again by the next update.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

from agent.bundles.wheels import platform_fits, python_fits, wheel_tags
from agent.deployment.agent_switch import INSTALLED_MARK, AgentDirs
from agent.errors import BundleError, ErrorCode
from runtimes.files import atomic_write, fsync_tree

BASE_PTH = "edge-agent-base.pth"
_SEMVER = re.compile(r"^\d{1,4}\.\d{1,4}\.\d{1,4}([-+.][0-9A-Za-z.+-]{1,40})?$")


class AgentUpdateError(BundleError):
    """An agent update refused: `code` (docs/fleet.md#agent-update-error-codes) and the reason."""


def check_wheels(wheels: list[Path], python: tuple[int, int] | None = None, machine: str | None = None) -> str:
    """The edge-agent version the `wheels` carry, after checking each one fits this Python and
    architecture (`python`, `machine`: this interpreter's by default); `AgentUpdateError` else."""
    major, minor = python or sys.version_info[:2]
    arch = (machine or platform.machine()).lower()
    versions = []
    for wheel in wheels:
        tags = wheel_tags(wheel.name)
        if tags is None:
            raise AgentUpdateError(ErrorCode.AGENT_UPDATE_MALFORMED, f"{wheel.name} is not a wheel's file name")
        if not any(python_fits(tag, major, minor) for tag in tags.pythons):
            wanted = f"Python {major}.{minor}"
            reason = f"{wheel.name} is for {'.'.join(tags.pythons)}; this device runs {wanted}"
            raise AgentUpdateError(ErrorCode.AGENT_UPDATE_WRONG_PYTHON, reason)
        if not any(platform_fits(plat, arch) for plat in tags.platforms):
            reason = f"{wheel.name} is for {'.'.join(tags.platforms)}; this device is {arch}"
            raise AgentUpdateError(ErrorCode.AGENT_UPDATE_WRONG_ARCHITECTURE, reason)
        if tags.is_agent:
            versions.append(tags.version)
    if len(versions) != 1:
        reason = f"an agent update holds one edge-agent wheel, not {len(versions)}"
        raise AgentUpdateError(ErrorCode.AGENT_UPDATE_MALFORMED, reason)
    if not _SEMVER.match(versions[0]):
        raise AgentUpdateError(ErrorCode.AGENT_UPDATE_MALFORMED, f"{versions[0]!r} is not a SemVer version")
    return versions[0]


def install_update(
    dirs: AgentDirs,
    wheels: list[Path],
    running: Path,
    allow_downgrade: bool,
    on_removed: Callable[[str], None] = lambda version: None,
) -> str:
    """Check `wheels` against this device and the running version, remove the environments no
    longer needed (`on_removed` is told each version) and install `agents/<version>`; returns the
    version, ready for `AgentDirs.switch`. `AgentUpdateError` for each refusal."""
    import semver

    from agent import __version__

    version = check_wheels(wheels)
    now = dirs.current_version() or __version__
    if semver.Version.parse(version) <= semver.Version.parse(now) and not allow_downgrade:
        reason = f"{version} is not newer than {now} (allow a downgrade to switch back)"
        raise AgentUpdateError(ErrorCode.AGENT_UPDATE_DOWNGRADE, reason)
    if version == dirs.current_version() or dirs.env(version) == running:
        raise AgentUpdateError(ErrorCode.AGENT_UPDATE_RUNNING, f"{version} is the running version")
    for old in dirs.prune(keep=version):
        on_removed(old)
    install_env(dirs.root, version, wheels, dirs.base)  # again if it was: the wheels given
    return version


def base_site_packages(running: Path) -> Path:
    """The installed environment's site-packages: where `running` layers on, or its own."""
    pth = _purelib(running) / BASE_PTH
    if pth.exists():
        return Path(_read(pth).strip())
    return _purelib(running)


def install_env(root: Path, version: str, wheels: list[Path], running: Path) -> Path:
    """Make ``root/<version>``: a venv layered on `running`'s base with `wheels` installed
    (never the running or current version's: the caller checks)."""
    incoming = root / version
    shutil.rmtree(incoming, ignore_errors=True)  # left by a crash mid-install
    root.mkdir(parents=True, exist_ok=True)
    system_site = "include-system-site-packages = true" in _read(running / "pyvenv.cfg")
    site = ["--system-site-packages"] if system_site else []
    make = [_base_python(running), "-m", "venv", "--without-pip", *site, str(incoming)]
    made = subprocess.run(make, capture_output=True, text=True)
    if made.returncode != 0:
        detail = made.stderr.strip().splitlines()[-1:] or ["no output"]
        raise AgentUpdateError(ErrorCode.AGENT_UPDATE_INSTALL_FAILED, f"venv: {detail[0]}")
    (_purelib(incoming) / BASE_PTH).write_text(f"{base_site_packages(running)}\n")
    pip = [str(incoming / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    for args in (["install", "--no-index", "--no-deps", "--ignore-installed", *map(str, wheels)], ["check"]):
        done = subprocess.run([*pip, *args], capture_output=True, text=True, env=_clean_env())
        if done.returncode != 0:
            shutil.rmtree(incoming, ignore_errors=True)
            detail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise AgentUpdateError(ErrorCode.AGENT_UPDATE_INSTALL_FAILED, f"pip {args[0]}: {' / '.join(detail)}")
    fsync_tree(incoming)
    atomic_write(incoming / INSTALLED_MARK, f"{version}\n".encode())
    return incoming


def _purelib(env: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))


def _base_python(running: Path) -> str:
    """The system Python the running venv was made from (`home` in pyvenv.cfg)."""
    for line in _read(running / "pyvenv.cfg").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return str(Path(value.strip()) / f"python{sys.version_info[0]}.{sys.version_info[1]}")
    return sys.executable


def _read(path: Path) -> str:
    try:
        return path.read_text()[:10000]
    except OSError:
        return ""


def _clean_env() -> dict[str, str]:
    import os

    return {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PIP_INDEX_URL")}
