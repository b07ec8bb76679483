"""One daemon per state directory: `StateDirLock` holds ``<state_dir>/agent.lock`` for the
daemon's life.

Two daemons on one state directory would both move the current/previous pointers, write the
deployment record and resume each other's downloads. The lock is an exclusive `fcntl.flock` on
the file, taken without waiting; the holder writes its PID into it, so the second daemon's
`ConfigError` names the process to stop. The kernel lets go of the lock when the holder exits,
however it ends (``kill -9`` included): a stale file never blocks a start.

On a read-only disk (an SD card the kernel remounted after errors) the file cannot be opened for
writing: the folder itself is locked instead, without a PID, and the daemon runs on, detecting
and serving its page with the problem shown (`agent.web.problems.judge_disk`). Two daemons on
that folder still exclude each other; only the second one's message lacks the first one's PID.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from agent.errors import ConfigError

LOCK_NAME = "agent.lock"


class StateDirLock:
    """The lock on `state_dir` (``acquire`` takes it, ``release`` lets go; not thread-safe: the
    main thread takes and releases it)."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None
        self.read_only = False  # the disk is read-only: the folder itself is locked, no PID written

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> StateDirLock:
        """Take the lock and write this process's PID into the file; raises `ConfigError` naming
        the lock file and the PID that holds it when another process does, `OSError` when the
        file cannot be opened."""
        if self._fd is not None:
            return self
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            if exc.errno != errno.EROFS:
                raise
            fd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY)  # a read-only disk: lock the folder
            self.read_only = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            raise ConfigError(
                f"the state directory {self.state_dir} is in use: another edge-agent (PID {holder}) holds "
                f"{self.path}; stop it first, or give this agent its own state_dir"
            ) from None
        except OSError:
            os.close(fd)
            raise
        if not self.read_only:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        """Let go of the lock (the file stays: the next holder overwrites the PID)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor ends the flock
            self._fd = None


def _read_pid(fd: int) -> str:
    """The PID the holder wrote, or ``unknown`` (a holder between its lock and its write)."""
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"
