"""Wheels' tags, read from their file names (PEP 427): which Python and architecture a wheel is
for, and whether it fits a target. Pure and shared by the two ends of an agent update: the
operator's ``bundle build --agent`` (agent/bundles/agent_bundle.py), which checks each wheel
against the target the bundle declares, and the device (agent/deployment/agent_env.py), which
checks each wheel against itself (docs/fleet.md#agent-updates)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_WHEEL = re.compile(
    r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$"
)
#: edge-agent's own distribution, as a wheel's file name spells it
AGENT_DIST = "edge_agent"


@dataclass(frozen=True)
class WheelTags:
    """A wheel's name, version and tags (each a set: ``py2.py3`` is two Python tags)."""

    name: str
    version: str
    pythons: tuple[str, ...]
    platforms: tuple[str, ...]

    @property
    def is_agent(self) -> bool:
        return self.name.lower().replace(".", "_").replace("-", "_") == AGENT_DIST


def wheel_tags(file_name: str) -> WheelTags | None:
    """The tags of the wheel `file_name`, or None when it is not a wheel's file name."""
    match = _WHEEL.match(file_name)
    if match is None:
        return None
    return WheelTags(match["name"], match["version"], tuple(match["py"].split(".")), tuple(match["plat"].split(".")))


def python_fits(tag: str, major: int, minor: int) -> bool:
    """Whether a wheel's Python tag runs on CPython `major`.`minor` (``py3``, ``py311``, ``cp311``)."""
    return tag in (f"py{major}", f"py{major}{minor}", f"cp{major}{minor}")


def platform_fits(tag: str, arch: str) -> bool:
    """Whether a wheel's platform tag runs on the architecture `arch` (``any``, or a tag ending
    in it: ``manylinux_2_17_aarch64``, ``linux_x86_64``)."""
    return tag == "any" or tag.lower().endswith(arch.lower())


def python_version(target: str) -> tuple[int, int] | None:
    """The CPython version a target Python tag names (``cp311``, ``py311``: 3.11), None for one
    that names a major version only (``py3``: any)."""
    match = re.fullmatch(r"(?:cp|py)(\d)(\d{1,2})", target)
    return (int(match[1]), int(match[2])) if match else None


def fits_target(wheel: WheelTags, python: str, arch: str) -> tuple[Literal["python", "arch"], str] | None:
    """Why `wheel` does not fit a bundle declared for the Python tag `python` (``py3``: any
    Python 3; ``cp311``: CPython 3.11) and the architecture `arch` (``any``: every one), which
    of the two and in words naming both; None when it fits."""
    version = python_version(python)
    if version is None:
        if "py3" not in wheel.pythons:
            return "python", f"it is for {'.'.join(wheel.pythons)}, the bundle for any Python 3 ({python})"
    elif not any(python_fits(tag, *version) for tag in wheel.pythons):
        return "python", f"it is for {'.'.join(wheel.pythons)}, the bundle for {python}"
    if arch == "any":
        if wheel.platforms != ("any",):
            return "arch", f"it is for {'.'.join(wheel.platforms)}, the bundle for any architecture"
    elif not any(platform_fits(tag, arch) for tag in wheel.platforms):
        return "arch", f"it is for {'.'.join(wheel.platforms)}, the bundle for {arch}"
    return None
