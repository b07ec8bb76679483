"""The agent's own versions on the device: which environment runs, the switch to a new one and
the way back (docs/fleet.md#agent-updates).

Layout, under the state directory (the one folder the service may write, and shared by every
version, so model bundles and the deployment record survive an agent update both ways)::

    agents/<version>/      a venv with that edge-agent in it (agent_env.py makes it; whole once
                           it holds `INSTALLED_MARK`)
    agents/current         a symlink to <version>; absent: the installed environment runs
    agents/switch.json     the record of the last switch: pending, confirmed or rolled back

`launch` runs first in every ``edge-agent run`` (the installed environment's, under systemd) and
answers which environment must run instead of this one (then the caller execs it). While a
switch is pending it counts the starts: a new version that has not confirmed itself after
`MAX_STARTS` starts (it crashes at import, or its probation never passes) is switched back to
the previous one. `Probation` is the new process's own check: it confirms the switch once the
agent is healthy with its broker connected, and asks for the way back after `CONFIRM_WITHIN_S`.

Every step is one atomic write or rename (runtimes/files.py): a SIGKILL or power cut anywhere
leaves one whole version to run. The order in `switch`: the record (pending, previous) first,
then the symlink; so a symlink that points at a version has a record that can take it back, and
a pending record whose version the symlink does not name is a switch that never happened.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from runtimes.files import atomic_symlink, atomic_write

#: starts of a pending version (the first exec included) before the launcher switches back
MAX_STARTS = 3
#: seconds a new version has to confirm itself (healthy, broker connected) in its first start
CONFIRM_WITHIN_S = 120.0
#: set by the exec into an agent environment: that start was already counted
LAUNCHED_ENV = "EDGE_AGENT_LAUNCHED"
#: set by the exec into an agent environment: the installed environment's prefix
BASE_ENV = "EDGE_AGENT_BASE"
#: the exit status of ``edge-agent run`` that asks for a restart into `agents/current`
RESTART = 75
RECORD_MAX_BYTES = 4096
#: written last into ``agents/<version>/`` by the installer: the environment is whole
INSTALLED_MARK = "edge-agent.installed"

SwitchState = Literal["pending", "confirmed", "rolled_back"]


@dataclass(frozen=True)
class SwitchRecord:
    """The last switch: to `version` from `previous` (None: the installed environment)."""

    version: str
    previous: str | None
    state: SwitchState
    starts: int = 0
    reason: str = ""
    deployment: str = ""  # the fleet deployment that switched (empty: `edge-agent upgrade`, or an older agent)


class AgentDirs:
    """The agents folder under a state directory, and the installed environment (`base`)."""

    def __init__(self, state_dir: Path, base: Path) -> None:
        self.root, self.base = state_dir / "agents", base

    @property
    def current(self) -> Path:
        return self.root / "current"

    @property
    def record_path(self) -> Path:
        return self.root / "switch.json"

    def env(self, version: str | None) -> Path:
        """The environment of `version` (None: the installed one)."""
        return self.base if version is None else self.root / version

    def target(self, version: str | None) -> Path:
        """The environment to run for `version`: the installed one when that version's folder is
        gone or was never finished."""
        env = self.env(version)
        return env if version is None or self.whole(version) else self.base

    def whole(self, version: str) -> bool:
        return (self.env(version) / INSTALLED_MARK).is_file()

    def current_version(self) -> str | None:
        """The version `current` names (None: no symlink, the installed environment)."""
        try:
            name = os.readlink(self.current)
        except (FileNotFoundError, OSError):
            return None
        return name if name and "/" not in name and name not in (".", "..") else None  # only a sibling

    def record(self) -> SwitchRecord | None:
        """The record, or None when there is none or it cannot be read (then the symlink rules)."""
        try:
            with self.record_path.open("rb") as handle:
                data = json.loads(handle.read(RECORD_MAX_BYTES + 1)[:RECORD_MAX_BYTES])
            return SwitchRecord(
                version=str(data["version"]),
                previous=None if data["previous"] is None else str(data["previous"]),
                state=data["state"] if data["state"] in ("pending", "confirmed", "rolled_back") else "rolled_back",
                starts=int(data.get("starts", 0)),
                reason=str(data.get("reason", ""))[:500],
                deployment=str(data.get("deployment", ""))[:200],
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, record: SwitchRecord) -> None:
        atomic_write(self.record_path, json.dumps(asdict(record)).encode())

    def point(self, version: str | None) -> None:
        """`current` to `version` atomically (None: removed, the installed environment runs)."""
        if version is None:
            self.current.unlink(missing_ok=True)
        else:
            atomic_symlink(self.current, Path(version))

    def switch(
        self, version: str, on_step: Callable[[str], None] = lambda step: None, deployment: str = ""
    ) -> SwitchRecord:
        """Switch to the installed `agents/<version>`: the record first, then the symlink;
        `deployment` names the fleet deployment that asked (kept through the way back)."""
        record = SwitchRecord(
            version=version, previous=self.current_version(), state="pending", starts=1, deployment=deployment
        )
        self.root.mkdir(parents=True, exist_ok=True)
        on_step("record")
        self.write(record)
        on_step("symlink")
        self.point(version)
        on_step("switched")
        return record

    def roll_back(
        self, record: SwitchRecord, reason: str, on_step: Callable[[str], None] = lambda step: None
    ) -> SwitchRecord:
        """Back to `record.previous`: the symlink first (the record still says pending, so a
        crash here is rolled back again at the next start), then the record."""
        on_step("symlink")
        self.point(record.previous)
        done = replace(record, state="rolled_back", reason=reason)
        on_step("record")
        self.write(done)
        return done

    def prune(self, keep: str) -> list[str]:
        """Remove every version's environment but `keep`, the current one and the record's two
        (the way back stays); returns the versions removed."""
        record = self.record()
        kept = {keep, self.current_version(), *((record.version, record.previous) if record else ())}
        removed = []
        for folder in sorted(self.root.iterdir()) if self.root.is_dir() else ():
            if folder.is_dir() and not folder.is_symlink() and folder.name not in kept:
                (folder / INSTALLED_MARK).unlink(missing_ok=True)  # unmarked first: never run half removed
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
        return removed

    def confirm(self) -> None:
        record = self.record()
        if record is not None and record.state == "pending":
            self.write(replace(record, state="confirmed"))


def launch(dirs: AgentDirs, running: Path, launched: bool, installed: str | None = None) -> Path | None:
    """At the start of ``edge-agent run`` in the environment `running` (`launched`: the exec
    into it was counted already): the environment that must run instead, or None (this one).
    Counts a pending version's starts and switches back after `MAX_STARTS`. `installed`: the
    installed environment's version, when known (the first start runs in it): a version
    `current` names that is older gives way to it (`give_way`)."""
    if installed is not None:
        give_way(dirs, installed)
    record = dirs.record()
    current = dirs.current_version()
    if record is not None and record.state == "pending":
        if current != record.version:  # killed between the record and the symlink: never switched
            dirs.write(replace(record, state="rolled_back", reason="the switch did not finish"))
        elif not launched:
            counted = replace(record, starts=record.starts + 1)
            if counted.starts > MAX_STARTS:
                dirs.roll_back(counted, f"{record.version} did not confirm within {MAX_STARTS} starts")
                current = record.previous
            else:
                dirs.write(counted)
    target = dirs.target(current)  # a symlink to a version that is gone: the installed one is whole
    return None if _same(target, running) else target


def give_way(dirs: AgentDirs, installed: str) -> bool:
    """Back to the installed environment when it holds a newer edge-agent (`installed`) than
    the version `current` names: install.sh ``--from`` a newer wheel, or pip, upgraded it in
    place, and that upgrade must run rather than be hidden by an older fleet update. The symlink
    first, then the record (rolled back, saying why; a pending switch so ends), as `roll_back`.
    True when it did."""
    import semver

    current = dirs.current_version()
    try:
        older = current is not None and semver.Version.parse(current) < semver.Version.parse(installed)
    except ValueError:  # a folder that is no version: the symlink rules as before
        older = False
    if not older or current is None:
        return False
    record = dirs.record()
    if record is None or record.version != current:  # switched by an agent without a record
        record = SwitchRecord(version=current, previous=None, state="confirmed")
    dirs.point(None)
    reason = f"edge-agent {installed} was installed in the installed environment, newer than {current}"
    dirs.write(replace(record, state="rolled_back", reason=reason))
    return True


def exec_agent(dirs: AgentDirs, env: Path, argv: list[str]) -> None:
    """Replace this process by `env`'s ``edge-agent`` with the same arguments (the same pid, so
    systemd's MAINPID and READY stay right)."""
    program = str(env / "bin" / "edge-agent")
    os.execve(program, [program, *argv], {**os.environ, LAUNCHED_ENV: "1", BASE_ENV: str(dirs.base)})


def running_environment() -> Path:
    return Path(sys.prefix)


def base_environment() -> Path:
    """The installed environment: the one the launcher exec'd this one from, else this one."""
    return Path(os.environ.get(BASE_ENV) or running_environment())


def _same(one: Path, other: Path) -> bool:
    try:
        return one.resolve() == other.resolve()
    except OSError:
        return False


class Probation:
    """The new version's check of itself, ticked by the main thread: `tick(healthy, now)` says
    "confirmed" once healthy, "failed" when `CONFIRM_WITHIN_S` passed first, else None."""

    def __init__(self, dirs: AgentDirs, started: float, within_s: float = CONFIRM_WITHIN_S) -> None:
        self.dirs, self.within_s, self.deadline, self.done = dirs, within_s, started + within_s, False

    @classmethod
    def for_running(cls, dirs: AgentDirs, running: Path, started: float) -> Probation | None:
        """A probation when `running` is a pending version's environment, else None."""
        record = dirs.record()
        if record is None or record.state != "pending" or not _same(dirs.env(record.version), running):
            return None
        return cls(dirs, started)

    def tick(self, healthy: bool, now: float) -> Literal["confirmed", "failed"] | None:
        if self.done:
            return None
        if healthy:
            from agent.bundles.installer import checkpoint  # loaded by the daemon already

            checkpoint("agent-confirming")
            self.done = True
            self.dirs.confirm()
            return "confirmed"
        if now >= self.deadline:
            self.done = True
            record = self.dirs.record()
            if record is not None and record.state == "pending":
                self.dirs.roll_back(record, f"{record.version} was not healthy within {self.within_s:.0f} s")
            return "failed"
        return None


class AgentWatch:
    """What the main thread of ``edge-agent run`` asks every tick: `restart(healthy, now)` is
    True when this process must stop and exec `agents/current` (a switch to another version,
    or its own probation failed and switched back). `probation` is ticked while it runs."""

    def __init__(self, dirs: AgentDirs, running: Path, probation: Probation | None) -> None:
        self.dirs, self.running, self.probation = dirs, running, probation

    def restart(self, healthy: Callable[[], bool], now: float) -> bool:
        probation = self.probation
        if probation is not None and not probation.done and probation.tick(healthy(), now) == "failed":
            return True
        return not _same(self.dirs.target(self.dirs.current_version()), self.running)
