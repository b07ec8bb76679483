"""The agents' versions as the operator sees them (docs/fleet.md#versions): `VersionSpec`, the
``fleet status --version-filter`` that picks devices by the version their status names, and
`too_old`, the devices that cannot read a control document of a given protocol.

A version filter is a comma-separated list of clauses, each an operator (``==``, ``!=``, ``<``,
``<=``, ``>``, ``>=``; none means ``==``) and a SemVer version, all of which must hold:
``<0.2.0``, ``==0.2.0``, ``>=0.2.0,<0.3.0``. Compared by SemVer's precedence (the ``semver``
library the bundle store already uses; ``packaging`` is no dependency of ours). A device whose
version is unknown (no status, an agent before 0.2.0 that went offline, a version that is not
SemVer) matches no filter.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import semver

from agent.mqtt.device_documents import StatusDocument

#: a filter longer than this is refused unread (it comes from the command line)
MAX_SPEC = 200
_OPERATORS: dict[str, Callable[[semver.Version, semver.Version], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_CLAUSE = re.compile(r"^\s*(==|!=|<=|>=|<|>)?\s*(\S+)\s*$")


@dataclass(frozen=True)
class VersionSpec:
    """The clauses of a ``--version-filter``: (operator, version) pairs that must all hold."""

    text: str
    clauses: tuple[tuple[str, semver.Version], ...]

    @classmethod
    def parse(cls, text: str) -> VersionSpec:
        """`text` as a filter; `ValueError` naming the clause that is not one."""
        if len(text) > MAX_SPEC:
            raise ValueError(f"a version filter is at most {MAX_SPEC} characters, not {len(text)}")
        clauses = []
        for clause in text.split(","):
            found = _CLAUSE.match(clause)
            if found is None:
                raise ValueError(f"{clause!r} is not a version clause: give e.g. <0.2.0, ==0.2.0 or >=0.2.0,<0.3.0")
            try:
                version = semver.Version.parse(found[2])
            except ValueError as exc:
                raise ValueError(f"{found[2]!r} in {text!r} is not a SemVer version (MAJOR.MINOR.PATCH)") from exc
            clauses.append((found[1] or "==", version))
        return cls(text, tuple(clauses))

    def matches(self, version: str | None) -> bool:
        """Whether `version` (as a status names it; None: unknown) satisfies every clause."""
        if version is None or not semver.Version.is_valid(version):
            return False
        parsed = semver.Version.parse(version)
        return all(_OPERATORS[op](parsed, wanted) for op, wanted in self.clauses)


def spoken_protocol(status: StatusDocument) -> int:
    """The newest control protocol the device reads: its status' ``protocol``; an agent before
    0.2.0 names none and reads protocol 1 (documents without ``protocol``)."""
    return status.protocol or 1


def too_old(statuses: Mapping[str, StatusDocument], needed: int) -> dict[str, str]:
    """{device: why it cannot read a document of protocol `needed`} for each device of
    `statuses` that reads an older protocol, in the operator's words."""
    old = {}
    for device, status in statuses.items():
        speaks = spoken_protocol(status)
        if speaks < needed:
            runs = f"edge-agent {status.agent_version}" if status.agent_version else "an edge-agent of unknown version"
            old[device] = (
                f"{device} runs {runs}, which reads control documents of protocol {speaks} and older; this one is "
                f"protocol {needed}, so it will refuse it: update edge-agent on {device} first"
            )
    return old
