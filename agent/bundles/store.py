"""The on-device store of installed bundle versions and the deployment record.

Layout under the state directory (default ``/var/lib/edge-agent``)::

    versions/<sha256>/        an unpacked, verified bundle (``<sha256>.tmp`` while unpacking)
    downloads/<sha256>/       a bundle being downloaded chunk by chunk (agent.daemon.transfer)
    current -> versions/<sha> the version that serves
    previous -> versions/<sha>
    deployment.json           the last deployment: id, bundle, state, error, history
    followed.json             the id of the last desired document acted on

Pointers are symlinks replaced with ``rename`` and files are written to a temp file, fsynced
and renamed, so a crash at any point leaves either the old or the new state, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from agent.errors import BundleError, ErrorCode
from runtimes.base import atomic_write, fsync_dir


class State(str, Enum):
    """The states of a deployment, in the order a successful one passes them (docs/bundles.md,
    docs/mqtt.md). A `str`, so it compares to and serialises as its name."""

    QUEUED = "QUEUED"
    DOWNLOADING = "DOWNLOADING"
    VERIFYING = "VERIFYING"
    INSTALLING = "INSTALLING"
    ACTIVATING = "ACTIVATING"
    SUCCEEDED = "SUCCEEDED"
    REJECTED = "REJECTED"
    FAILED = "FAILED"
    ROLLED_BACK = "ROLLED_BACK"

    def __str__(self) -> str:
        return self.value


#: a deployment in one of these has ended: nothing more happens to it
FINAL_STATES = frozenset({State.SUCCEEDED, State.REJECTED, State.ROLLED_BACK})
#: a deployment in one of these touched no version: the daemon resumes it after a restart
RESUMABLE_STATES = frozenset({State.QUEUED, State.DOWNLOADING})


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder` (after an unpack, before the rename)."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(Path(root) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


@dataclass
class Deployment:
    """One attempt to install and activate a bundle (or a rollback)."""

    id: str
    sha256: str
    state: State = State.QUEUED
    name: str | None = None
    version: str | None = None
    error: dict[str, str] | None = None
    from_sha: str | None = None  # `current` when it started
    previous_before: str | None = None  # `previous` when it started
    attempt: int = 1  # the daemon retries a deployment once after a crash while verifying or installing
    history: list[tuple[State, float]] = field(default_factory=list)
    tuning: dict[str, Any] | None = None  # autotune at activation: the choice and the measured rows

    def to(self, state: State, error: BundleError | None = None) -> None:
        """Enter `state` (recorded in the history); `error` becomes the record's code and message."""
        self.state = State(state)
        if error is not None:
            self.error = {"code": error.code, "message": error.message}
        self.history.append((state, round(time.time(), 3)))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Deployment:
        raw = dict(raw)
        raw["state"] = State(raw.get("state", State.QUEUED))
        raw["history"] = [(State(state), float(ts)) for state, ts in raw.get("history", [])]
        return cls(**raw)


@dataclass(frozen=True)
class VersionInfo:
    sha256: str
    name: str
    version: str
    path: Path


class Store:
    """Installed versions, the current/previous pointers and the deployment record."""

    def __init__(self, root: Path, keep: int = 3) -> None:
        if keep < 2:
            raise ValueError(f"keep must be at least 2 (current and previous), got {keep}")
        self.root, self.keep = root, keep
        self.versions = root / "versions"

    def ensure(self) -> Store:
        try:
            self.versions.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(f"cannot create the state directory {self.root}: {exc.strerror}") from exc
        return self

    # -- pointers ------------------------------------------------------------------------

    def _pointer(self, name: str) -> str | None:
        link = self.root / name
        try:
            target = os.readlink(link)
        except OSError:
            return None
        sha = Path(target).name
        return sha if (self.versions / sha / "manifest.json").is_file() else None

    def current_sha(self) -> str | None:
        return self._pointer("current")

    def previous_sha(self) -> str | None:
        return self._pointer("previous")

    def _set_pointer(self, name: str, sha: str | None) -> None:
        link = self.root / name
        if sha is None:
            link.unlink(missing_ok=True)
        else:
            tmp = self.root / f".{name}.tmp"
            tmp.unlink(missing_ok=True)
            os.symlink(Path("versions") / sha, tmp)
            os.replace(tmp, link)
        fsync_dir(self.root)

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

    def info(self, sha: str | None) -> VersionInfo | None:
        if sha is None:
            return None
        folder = self.versions / sha
        try:
            manifest = json.loads((folder / "manifest.json").read_bytes())
        except (OSError, ValueError):
            return None
        return VersionInfo(sha, str(manifest.get("name")), str(manifest.get("version")), folder)

    # -- deployment record ---------------------------------------------------------------

    def record(self, deployment: Deployment) -> None:
        atomic_write(self.root / "deployment.json", json.dumps(asdict(deployment), indent=2).encode())

    def followed(self) -> str | None:
        """The id of the last desired document this device acted on (it acts on each id once)."""
        try:
            return str(json.loads((self.root / "followed.json").read_bytes())["id"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def follow(self, desired_id: str) -> None:
        atomic_write(self.root / "followed.json", json.dumps({"id": desired_id}).encode())

    @property
    def downloads(self) -> Path:
        return self.root / "downloads"

    def last_deployment(self) -> Deployment | None:
        try:
            return Deployment.from_dict(json.loads((self.root / "deployment.json").read_bytes()))
        except (OSError, ValueError, TypeError):
            return None

    # -- tuning (autotune's choice per version) -------------------------------------------

    def _tuning_path(self, sha: str) -> Path:
        return self.root / "tuning" / f"{sha}.json"

    def save_tuning(self, sha: str, document: dict[str, Any]) -> None:
        """Keep what autotune chose for version `sha` (the cameras serve it that way)."""
        self._tuning_path(sha).parent.mkdir(exist_ok=True)
        atomic_write(self._tuning_path(sha), json.dumps(document, indent=2).encode())

    def tuning(self, sha: str | None) -> dict[str, Any] | None:
        """Autotune's choice for version `sha`, or None (not tuned, or unreadable)."""
        if sha is None:
            return None
        try:
            document = json.loads(self._tuning_path(sha).read_bytes())
        except (OSError, ValueError):
            return None
        return document if isinstance(document, dict) else None

    # -- housekeeping --------------------------------------------------------------------

    def remove_version(self, sha: str) -> None:
        if sha not in (self.current_sha(), self.previous_sha()):
            shutil.rmtree(self.versions / sha, ignore_errors=True)
            self._tuning_path(sha).unlink(missing_ok=True)

    def gc(self) -> list[str]:
        """Keep `keep` versions: current and previous always, then the newest others."""
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
        return removed

    def recover(self) -> Deployment | None:
        """Finish or undo a deployment a crash interrupted; remove partial unpacks.

        Returns the deployment it changed, if any. After it, `current` names a complete version
        (or nothing, on a device that never had one).
        """
        if not self.versions.is_dir():
            return None
        for partial in self.versions.glob("*.tmp"):
            shutil.rmtree(partial, ignore_errors=True)
        for name in ("current", "previous"):
            if (self.root / name).is_symlink() and self._pointer(name) is None:
                (self.root / name).unlink()  # points at a version that is gone
        deployment = self.last_deployment()
        if deployment is None or deployment.state in (*FINAL_STATES, *RESUMABLE_STATES):
            return None  # a download touched no version; the daemon resumes it
        if deployment.state == State.ACTIVATING and self.current_sha() == deployment.sha256:
            deployment.to(State.SUCCEEDED)  # switched, but the record was not written yet
        else:
            if self.current_sha() != deployment.from_sha and deployment.from_sha is not None:
                self._set_pointer("current", deployment.from_sha)
            if self.previous_sha() != deployment.previous_before:
                self._set_pointer("previous", deployment.previous_before)
            if deployment.sha256 not in (self.current_sha(), self.previous_sha()):
                shutil.rmtree(self.versions / deployment.sha256, ignore_errors=True)
            interrupted = BundleError(ErrorCode.INTERRUPTED, f"the agent stopped during {deployment.state}")
            if deployment.state == State.ACTIVATING:
                deployment.to(State.FAILED, interrupted)
                deployment.to(State.ROLLED_BACK)
            else:
                deployment.to(State.REJECTED, interrupted)
        self.record(deployment)
        return deployment
