"""The on-device store of installed bundle versions and the deployment record.

Layout under the state directory (default ``/var/lib/edge-agent``)::

    versions/<sha256>/        an unpacked, verified bundle (``<sha256>.tmp`` while unpacking)
    downloads/<sha256>/       a bundle being downloaded chunk by chunk (agent.deployment.transfer)
    current -> versions/<sha> the version that serves
    previous -> versions/<sha>
    deployment.json           the last deployment: id, bundle, state, error, history
    followed.json             the last desired document acted on, the newest issue time
                              accepted from the device's and the group's topic, and the
                              device's own signed document in force (it survives a restart)
    installed.json            the highest version of each bundle name that succeeded here
    control.json              command ids already run (agent.mqtt.control)
    tuning/<sha256>.json      what autotune chose for that version (agent.bundles.tuning)

Removing versions (`gc`, `remove_version`) also prunes every backend's caches (TensorRT's
engines, OpenVINO's compiled models, any a plugin declares: `runtimes.registry.prune_caches`,
where the store's `runtimes` settings put them): entries made for models no installed version
has are removed, and each cache is kept within its size bound, never touching what the current
and previous versions use.

Pointers are symlinks swapped with `atomic_symlink` and files written with `atomic_write`, so a
crash at any point leaves either the old or the new state, never a mix. `recover` finishes or
undoes what a crash interrupted, and only ever deletes what it can prove is partial or was
installed by the interrupted deployment itself.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import semver
from pydantic import TypeAdapter, ValidationError

from agent.bundles.record import FINAL_STATES, RESUMABLE_STATES, Deployment, State, Tuning
from agent.errors import BundleError, ErrorCode, validation_problems
from runtimes.base import RuntimeName as RuntimeName  # pydantic < 2.6 resolves Tuning's annotations here
from runtimes.caches import InUse
from runtimes.files import atomic_symlink, atomic_write, fsync_dir
from runtimes.registry import RuntimeSettings, prune_caches

log = logging.getLogger(__name__)

PointerName = Literal["current", "previous"]
_TUNING = TypeAdapter(Tuning)


@dataclass(frozen=True)
class VersionInfo:
    sha256: str
    name: str
    version: str
    path: Path


@dataclass(frozen=True)
class Followed:
    """The last desired document acted on (`id`), the issue time (Unix seconds) of the newest
    control document accepted from the device's own topic and from its group's, and the
    device's own desired document in force as it arrived (`device_document`, its JSON: None when
    the device follows its group), so a restart keeps a pin that the broker lost."""

    id: str | None = None
    device_issued: float | None = None
    group_issued: float | None = None
    device_document: str | None = None


def version_key(version: str) -> semver.Version:
    """Semantic-version order (docs/bundles.md): 1.10.0 > 1.9.0 > 1.9.0-rc.2 > 1.9.0-rc.1."""
    return semver.Version.parse(version)


class Store:
    """Installed versions, the current/previous pointers and the deployment record.

    `problems` lists what `recover` found wrong and could not simply undo (a broken pointer, an
    unreadable record), in words for the status page. `runtimes` says where the backends keep
    their caches, pruned with the versions (default: each backend's under `root`, the state
    directory, as ``AgentConfig.runtime_settings`` puts them without a ``runtimes:`` section).
    """

    def __init__(self, root: Path, keep: int = 3, runtimes: RuntimeSettings | None = None) -> None:
        if keep < 2:
            raise ValueError(f"keep must be at least 2 (current and previous), got {keep}")
        self.root, self.keep = root, keep
        self.versions = root / "versions"
        self.runtimes = runtimes if runtimes is not None else RuntimeSettings().with_state_dir(root)
        self.problems: list[str] = []

    def ensure(self) -> Store:
        try:
            self.versions.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"cannot create the state directory {self.root}: {exc.strerror}") from exc
        return self

    # -- pointers ------------------------------------------------------------------------

    def _pointer_problem(self, name: PointerName) -> str | None:
        """What is wrong with pointer `name` (None when it is fine or absent)."""
        link = self.root / name
        if not link.is_symlink():
            return (
                f"{name} is not a link to a version (a {'folder' if link.is_dir() else 'file'})"
                if link.exists()
                else None
            )
        target = os.readlink(link)
        sha = Path(target).name
        if Path(target) not in (Path("versions") / sha, self.versions / sha):
            return f"{name} points outside the store ({target})"
        if not (self.versions / sha / "manifest.json").is_file():
            return f"{name} points at version {sha[:12]}, which is not installed"
        return None

    def _pointer(self, name: PointerName) -> str | None:
        link = self.root / name
        if not link.is_symlink() or self._pointer_problem(name) is not None:
            return None
        return Path(os.readlink(link)).name

    def current_sha(self) -> str | None:
        return self._pointer("current")

    def previous_sha(self) -> str | None:
        return self._pointer("previous")

    def _set_pointer(self, name: PointerName, sha: str | None) -> None:
        link = self.root / name
        if sha is None:
            link.unlink(missing_ok=True)
            fsync_dir(self.root)
        else:
            atomic_symlink(link, Path("versions") / sha)

    def switch(self, sha: str) -> None:
        """Make `sha` current; the old current becomes previous."""
        old = self.current_sha()
        if old is not None and old != sha:
            self._set_pointer("previous", old)
        self._set_pointer("current", sha)

    def rollback(self) -> str:
        """Swap current and previous; returns the sha now current."""
        previous, current = self.previous_sha(), self.current_sha()
        if previous is None:
            raise LookupError("there is no previous version to roll back to")
        self._set_pointer("current", previous)
        self._set_pointer("previous", current)
        return previous

    def undo_switch(self, deployment: Deployment) -> None:
        """Put the pointers back as they were before `deployment` switched to its version, as far
        as the versions it names still exist; then remove its version if it brought it."""
        if self.current_sha() == deployment.sha256:
            restored = deployment.from_sha if self.info(deployment.from_sha) else None
            self._set_pointer("current", restored)
            if self.previous_sha() == deployment.from_sha:
                self._set_pointer("previous", self._previous_for(deployment, restored))
        if deployment.sha256 not in (deployment.from_sha, deployment.previous_before):
            self.remove_version(deployment.sha256)

    def _previous_for(self, deployment: Deployment, current: str | None) -> str | None:
        """The `previous` to restore when undoing `deployment`: its `previous_before` if still
        installed; a record without one (an older agent's) keeps the newest other installed
        version, with a warning, rather than losing the rollback target."""
        if deployment.previous_before is not None:
            return deployment.previous_before if self.info(deployment.previous_before) else None
        others = sorted(
            (
                p
                for p in self.versions.iterdir()
                if p.is_dir()
                and not p.name.endswith(".tmp")
                and p.name not in (current, deployment.sha256)
                and self.info(p.name)
            ),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        kept = others[0].name if others else None
        log.warning(
            "deployment %s has no previous_before in its record; keeping %s as the previous version",
            deployment.id,
            kept[:12] if kept else "none",
        )
        return kept

    def info(self, sha: str | None) -> VersionInfo | None:
        if sha is None:
            return None
        folder = self.versions / sha
        try:
            manifest = json.loads((folder / "manifest.json").read_bytes())
        except (OSError, ValueError):
            return None
        return VersionInfo(sha, str(manifest.get("name")), str(manifest.get("version")), folder)

    # -- records -------------------------------------------------------------------------

    def record(self, deployment: Deployment) -> None:
        atomic_write(self.root / "deployment.json", deployment.to_json())

    def _read_record(self) -> tuple[Deployment | None, str | None]:
        path = self.root / "deployment.json"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None, None
        except OSError as exc:
            return None, f"{path} cannot be read: {exc.strerror}"
        try:
            return Deployment.from_json(raw), None
        except ValidationError as exc:
            problems = "; ".join(validation_problems(exc)[:3])
            return None, f"{path} is not a deployment record ({len(raw)} bytes: truncated?): {problems}"

    def last_deployment(self) -> Deployment | None:
        return self._read_record()[0]

    def followed(self) -> Followed:
        """What this device acted on last (it acts on each desired document once)."""
        try:
            raw = json.loads((self.root / "followed.json").read_bytes())
            fields = ("id", "device_issued", "group_issued", "device_document")
            return Followed(*(raw.get(name) for name in fields))
        except (OSError, ValueError, AttributeError):
            return Followed()

    def follow(self, followed: Followed) -> None:
        atomic_write(self.root / "followed.json", json.dumps(asdict(followed)).encode())

    def highest_version(self, name: str) -> str | None:
        """The highest version of bundle `name` that succeeded here (or is current or previous)."""
        try:
            highest: dict[str, str] = json.loads((self.root / "installed.json").read_bytes())
        except (OSError, ValueError):
            highest = {}
        candidates = [highest[name]] if isinstance(highest.get(name), str) else []
        candidates += [
            v.version for v in map(self.info, (self.current_sha(), self.previous_sha())) if v and v.name == name
        ]
        valid = [c for c in candidates if semver.Version.is_valid(c)]
        return max(valid, key=version_key) if valid else None

    def note_installed(self, name: str, version: str) -> None:
        """Remember `version` of `name` as succeeded (downgrades below the highest are refused)."""
        path = self.root / "installed.json"
        try:
            highest = json.loads(path.read_bytes())
        except (OSError, ValueError):
            highest = {}
        known = highest.get(name)
        if (
            not isinstance(known, str)
            or not semver.Version.is_valid(known)
            or version_key(version) > version_key(known)
        ):
            highest[name] = version
            atomic_write(path, json.dumps(highest, indent=2).encode())

    @property
    def downloads(self) -> Path:
        return self.root / "downloads"

    # -- tuning (autotune's choice per version) -------------------------------------------

    def _tuning_path(self, sha: str) -> Path:
        return self.root / "tuning" / f"{sha}.json"

    def save_tuning(self, sha: str, tuning: Tuning) -> None:
        """Keep what autotune chose for version `sha` (the cameras serve it that way)."""
        self._tuning_path(sha).parent.mkdir(exist_ok=True)
        atomic_write(self._tuning_path(sha), json.dumps(asdict(tuning), indent=2).encode())

    def tuning(self, sha: str | None) -> Tuning | None:
        """Autotune's choice for version `sha`, or None (not tuned, or a file that is not one:
        the runtime policy decides then)."""
        if sha is None:
            return None
        try:
            return _TUNING.validate_json(self._tuning_path(sha).read_bytes())
        except (OSError, ValueError):
            return None

    # -- housekeeping --------------------------------------------------------------------

    def remove_version(self, sha: str) -> None:
        """Remove version `sha` (never the current or previous one), then prune the caches."""
        if sha not in (self.current_sha(), self.previous_sha()):
            shutil.rmtree(self.versions / sha, ignore_errors=True)
            self._tuning_path(sha).unlink(missing_ok=True)
            self.prune_caches()

    def models_in_use(self) -> list[InUse]:
        """The model files of every installed version (detector and classifier artifacts), those of
        the current and previous versions `protected`, from each version's manifest.json. Raises
        `OSError` or `ValueError` when a version's cannot be read: what it uses is then unknown."""
        protected = {self.current_sha(), self.previous_sha()}
        found = []
        for folder in sorted(p for p in self.versions.iterdir() if p.is_dir() and not p.name.endswith(".tmp")):
            try:
                manifest = json.loads((folder / "manifest.json").read_bytes())
                stage = manifest.get("classifier") or {}
                artifacts = [*manifest.get("artifacts", []), *stage.get("artifacts", [])]
                found += [InUse(folder / a["path"], str(a["sha256"]), folder.name in protected) for a in artifacts]
            except (AttributeError, KeyError, TypeError) as exc:
                raise ValueError(f"version {folder.name[:12]}'s manifest.json lists no models: {exc!r}") from exc
        return found

    def prune_caches(self) -> list[Path]:
        """Prune every backend's caches to what the installed versions use, each within its bound
        (`runtimes.registry.prune_caches`); returns the files removed. Never raises; when what a
        version uses cannot be read, nothing is pruned (the next gc tries again)."""
        try:
            models = self.models_in_use() if self.versions.is_dir() else []
        except (OSError, ValueError) as exc:
            log.warning("caches not pruned: cannot tell what the installed versions use (%s)", exc)
            return []
        return prune_caches(self.runtimes, models)

    def gc(self) -> list[str]:
        """Keep `keep` versions: current and previous always, then the newest others; then prune
        the backends' caches to what those use."""
        protected = {sha for sha in (self.current_sha(), self.previous_sha()) if sha}
        others = sorted(
            (
                p
                for p in self.versions.iterdir()
                if p.is_dir() and not p.name.endswith(".tmp") and p.name not in protected
            ),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        removed = []
        for folder in others[max(0, self.keep - len(protected)) :]:
            shutil.rmtree(folder, ignore_errors=True)
            self._tuning_path(folder.name).unlink(missing_ok=True)
            removed.append(folder.name)
        self.prune_caches()
        return removed

    def _repair_pointers(self) -> None:
        """A broken `current` (a file, a link outside the store or to a missing version) falls back
        to `previous`; a broken `previous` is removed. Each repair is noted in `problems`."""
        for name in ("current", "previous"):
            problem = self._pointer_problem(name)
            if problem is None:
                continue
            link = self.root / name
            if link.is_dir() and not link.is_symlink():
                self.problems.append(f"{problem}: move it away, then restart the agent")
                continue
            fallback = self.previous_sha() if name == "current" else None
            self._set_pointer(name, fallback)
            if fallback is not None:
                self._set_pointer("previous", None)
                info = self.info(fallback)
                self.problems.append(
                    f"{problem}; serving the previous version {info.name} {info.version} instead" if info else problem
                )
            else:
                self.problems.append(f"{problem}; removed it")

    def recover(self) -> Deployment | None:
        """Finish or undo a deployment a crash interrupted; remove partial unpacks; repair broken
        pointers. Returns the deployment it changed, if any.

        Pointers change only when a deployment switches (at the end of ACTIVATING), so one cut
        short while verifying or installing changed none: it ends REJECTED (``INTERRUPTED``) and
        only the version it brought (neither current nor previous) is removed; so does one cut
        short in its shadow (nothing switched yet), never retried: the candidate beside the
        serving version may be what took the process down. One cut short after
        it switched is undone: the
        pointers go back and its version is removed; a deployment on probation (or that would
        have been) ends ROLLED_BACK with ``PROBATION_FAILED``, so a model that crashes the agent
        cannot crash-loop the device.
        """
        self.problems = []
        if not self.versions.is_dir():
            return None
        for partial in self.versions.glob("*.tmp"):
            shutil.rmtree(partial, ignore_errors=True)
        self._repair_pointers()
        deployment, problem = self._read_record()
        if problem is not None:
            self.problems.append(problem)
        if deployment is None or deployment.state in FINAL_STATES | RESUMABLE_STATES:
            return None  # nothing in flight, or a download that touched no version (the daemon resumes it)
        if deployment.kind == "agent" and deployment.state in (State.ACTIVATING, State.PROBATION):
            return None  # edge-agent's own switch: agents/switch.json says how it ended (the deployer reads it)
        switched = self.current_sha() == deployment.sha256 and deployment.from_sha != deployment.sha256
        if deployment.state in (State.VERIFYING, State.INSTALLING, State.SHADOW):  # nothing switched yet
            if deployment.sha256 not in (deployment.from_sha, deployment.previous_before):
                self.remove_version(deployment.sha256)  # brought by this deployment, never served
            during = "the shadow (not retried)" if deployment.state == State.SHADOW else deployment.state
            interrupted = BundleError(ErrorCode.INTERRUPTED, f"the agent stopped during {during}")
            deployment = deployment.to(State.REJECTED, interrupted)
        elif deployment.state == State.ACTIVATING and switched and not deployment.probation_s:
            deployment = deployment.to(State.SUCCEEDED)  # switched, but the record was not written yet
            if deployment.name and deployment.version:
                self.note_installed(deployment.name, deployment.version)
        else:
            self.undo_switch(deployment)
            if deployment.state == State.PROBATION or switched:
                error = BundleError(ErrorCode.PROBATION_FAILED, "the agent stopped while the version was on probation")
            else:
                error = BundleError(ErrorCode.INTERRUPTED, f"the agent stopped during {deployment.state}")
            deployment = deployment.to(State.FAILED, error).to(State.ROLLED_BACK)
        self.record(deployment)
        return deployment
