"""Event media on disk: each object event's snapshot kept under ``<state_dir>/media/`` with
retention by size and age, so the event carries a reference instead of a base64 blob and the
operator fetches the image when wanted (the ``media`` command, ``edge-agent fleet media``).
Clips (`agent.daemon.clips`) are kept beside them, ``<object_id>.mp4`` (or ``.avi``), under
the same retention: snapshots and clips together stay within ``events.media.max_mb``.

A snapshot is ``<state_dir>/media/<object_id>.jpg`` (the event id: 16 hex digits), written to
a temporary name and renamed (`runtimes.files.atomic_write`), so a reader never sees half a file
and a kill leaves at most a ``.tmp`` (removed at the next start). After each write the store
drops the oldest files (by modification time) while it holds more than ``events.media.max_mb``,
and any older than ``events.media.max_age_h``. A write the disk refuses is logged and the event
goes without its reference; detection never stops for it.

Free disk first: the state directory's disk also holds the outbox and the bundles a deployment
needs room for, so while its free space is under ``events.media.min_free_mb`` the oldest files
are deleted until it is not, and a new snapshot or clip that would take it under the floor with
nothing left to delete is not kept (the event goes without it; `problem` says why, and `usage`
carries it to the page's problems; the free space is read by `free_bytes`, injected in tests).
A clip is written by the ``clips`` thread to a hidden partial file (``.<id>.part.mp4``, removed
at the next start too) and `keep_clip` moves it into place (`runtimes.files.move_into_place`).

Threads: `put` runs on the cameras' inference threads (an event's ``end``), `keep_clip` on the
``clips`` thread, `get` and `clip` on the commands thread and the page's, `usage` from any
thread; one lock orders them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from agent.config.models import MediaSection
from agent.snapshot import MediaUsage
from runtimes.files import atomic_write, move_into_place

log = logging.getLogger(__name__)

#: an event id: what `agent.serving.events` gives each object (a file name only, never a path)
EVENT_ID = re.compile(r"[0-9a-f]{16}")
FOLDER = "media"
MIB = 1024 * 1024
#: what the store keeps, by suffix: the content type each is served with
CONTENT_TYPES = {".jpg": "image/jpeg", ".mp4": "video/mp4", ".avi": "video/x-msvideo"}
CLIP_SUFFIXES = (".mp4", ".avi")


def _files(folder: Path) -> list[tuple[Path, float, int]]:
    """Every snapshot and clip kept in `folder`: (path, modification time, bytes), oldest first."""
    found = []
    for path in folder.iterdir() if folder.is_dir() else ():
        if path.suffix not in CONTENT_TYPES or path.name.startswith("."):
            continue
        try:
            stat = path.stat()
        except OSError:
            continue
        found.append((path, stat.st_mtime, stat.st_size))
    return sorted(found, key=lambda f: (f[1], f[0].name))


def usage_of(folder: Path, now: float) -> MediaUsage:
    """What `folder` holds (read only: ``edge-agent doctor`` beside the running agent)."""
    files = _files(folder)
    oldest = min((mtime for _, mtime, _ in files), default=None)
    return MediaUsage(len(files), sum(size for _, _, size in files), None if oldest is None else round(now - oldest, 3))


def disk_free(folder: Path) -> int:
    """The bytes free on the disk holding `folder` (an unprivileged process's share)."""
    return shutil.disk_usage(folder).free


class MediaStore:
    """Snapshots under `folder` within `settings`; `clock` gives Unix seconds (the files' ages),
    `free_bytes` the free space of the disk holding the folder."""

    def __init__(
        self,
        folder: Path,
        settings: MediaSection,
        clock: Callable[[], float] = time.time,
        free_bytes: Callable[[Path], int] = disk_free,
    ) -> None:
        self.folder, self.settings, self._clock, self._free_bytes = folder, settings, clock, free_bytes
        self._lock = threading.Lock()
        self.problem: str | None = None
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for partial in [*folder.glob("*.tmp"), *folder.glob(".*.part.*")]:  # writes a kill cut short
                partial.unlink(missing_ok=True)
        except OSError as exc:
            self.problem = f"the media folder {folder} cannot be used: {exc}"
            log.error("%s", self.problem)

    def put(self, event_id: str, jpeg: bytes) -> str | None:
        """Keep the snapshot of event `event_id`; its reference (the file name), or None when the
        disk refused it."""
        if not EVENT_ID.fullmatch(event_id):
            raise ValueError(f"{event_id!r} is not an event id")
        name = f"{event_id}.jpg"
        with self._lock:
            if not self._room_locked(name, len(jpeg)):
                return None
            try:
                atomic_write(self.folder / name, jpeg, mtime=self._clock())
            except OSError as exc:
                if self.problem is None:
                    log.error("media: cannot write %s (%s): events go without their snapshot", name, exc)
                self.problem = f"the media folder {self.folder} refuses writes: {exc}"
                return None
            self.problem = None
            self._prune_locked()
        return name

    def get(self, event_id: str) -> bytes | None:
        """The snapshot of event `event_id` (None: never kept, or gone by retention)."""
        if not EVENT_ID.fullmatch(event_id):
            return None
        with self._lock:
            try:
                return (self.folder / f"{event_id}.jpg").read_bytes()
            except OSError:
                return None

    def keep_clip(self, event_id: str, written: Path) -> str | None:
        """Move the clip of event `event_id`, written at `written` (in this folder), into place;
        its reference (the file name), or None when the disk refused it."""
        if not EVENT_ID.fullmatch(event_id) or written.suffix not in CLIP_SUFFIXES:
            raise ValueError(f"{event_id!r}, {written.name!r} is not an event's clip")
        name = f"{event_id}{written.suffix}"
        with self._lock:
            if not self._room_locked(name, 0):  # the clip is on this disk already: only the floor
                return None
            try:
                now = self._clock()
                os.utime(written, (now, now))
                move_into_place(written, self.folder / name)
            except OSError as exc:
                log.error("media: cannot keep the clip %s (%s)", name, exc)
                self.problem = f"the media folder {self.folder} refuses writes: {exc}"
                return None
            self.problem = None
            self._prune_locked()
        return name

    def clip(self, event_id: str) -> tuple[bytes, str] | None:
        """The clip of event `event_id` and its content type (None: never kept, or gone)."""
        if not EVENT_ID.fullmatch(event_id):
            return None
        with self._lock:
            for suffix in CLIP_SUFFIXES:
                try:
                    return (self.folder / f"{event_id}{suffix}").read_bytes(), CONTENT_TYPES[suffix]
                except OSError:
                    continue
        return None

    def usage(self) -> MediaUsage:
        """What the store holds, with its `problem` (the page shows it)."""
        with self._lock:
            return replace(usage_of(self.folder, self._clock()), problem=self.problem)

    def _room_locked(self, name: str, incoming: int) -> bool:
        """Whether `incoming` more bytes leave the disk at or above ``min_free_mb`` once the
        oldest files are deleted (they are); else the problem said, and logged once."""
        if self._prune_locked(incoming):
            return True
        floor = self.settings.min_free_mb
        if self.problem is None or "min_free_mb" not in self.problem:
            log.error(
                "media: %s not kept: the disk has less than %.0f MiB free (events.media.min_free_mb)", name, floor
            )
        self.problem = (
            f"the disk of the media folder {self.folder} has less than {floor:.0f} MiB free "
            "(events.media.min_free_mb): new snapshots and clips are not kept"
        )
        return False

    def _short_locked(self, incoming: int) -> int:
        """The bytes the disk lacks to keep ``min_free_mb`` free after `incoming` more (0: none)."""
        floor = int(self.settings.min_free_mb * MIB)
        if floor <= 0:
            return 0
        try:
            free = self._free_bytes(self.folder)
        except OSError:
            return 0  # unknown: the write itself says whether the disk takes it
        return max(0, floor - (free - incoming))

    def _prune_locked(self, incoming: int = 0) -> bool:
        """Delete the oldest files while the store holds more than max_mb, any older than
        max_age_h, and while the disk lacks room for `incoming` bytes above ``min_free_mb``;
        False when it still lacks it with nothing left to delete."""
        files = _files(self.folder)
        total = sum(size for _, _, size in files)
        cutoff = self._clock() - self.settings.max_age_h * 3600
        limit = self.settings.max_mb * MIB
        short = self._short_locked(incoming)
        for path, mtime, size in files:
            if mtime >= cutoff and total <= limit and short <= 0:
                break
            path.unlink(missing_ok=True)
            total -= size
            short -= size
        return short <= 0
