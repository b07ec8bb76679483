"""Durable file writes and file hashes: the one place for each in the three packages.

A write here replaces its target so that a reader, or the device after a power cut, finds the
old content or the new, never a mix: the new content goes to a temporary file beside the target
(`temporary_path`), is flushed and fsynced, takes the target's name with `os.replace`, and the
folder is fsynced so that the rename itself survives. `atomic_write` takes bytes,
`atomic_writer` a stream (a bundle's tar), `atomic_symlink` swaps a symlink (the bundle store's
``current`` and ``previous``), `move_into_place` renames what was written elsewhere in the same
file system (an unpacked bundle's folder, a clip). `sha256_file` hashes files in 1 MiB chunks,
so a model of gigabytes is never held in memory.

It lives in `runtimes`, the lowest layer, because runtimes itself writes files this way (the
engine cache, OpenVINO's compiled models, TensorRT's timing cache) and hashes models, and
imports only go down (agent -> pipelines -> runtimes): from here all three packages reach it.
Standard library only. ``tests/house/test_helpers.py`` keeps it the only place: no
``os.replace`` and no hashing loop over a file's reads anywhere else.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

#: bytes read at a time when hashing
CHUNK = 1 << 20


def sha256_file(path: Path, *more: Path) -> str:
    """The hex SHA-256 of the bytes of `path` (followed by those of each of `more`, hashed as one
    stream: an OpenVINO IR's ``.xml`` and ``.bin``), read `CHUNK` bytes at a time. Raises
    `OSError` when one cannot be read (a folder, a missing file)."""
    digest = hashlib.sha256()
    for each in (path, *more):
        with each.open("rb") as file:
            while chunk := file.read(CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


class FileTooLarge(ValueError):
    """A file holds more bytes than its reader takes (`read_at_most`)."""


def read_at_most(path: Path, limit: int) -> bytes:
    """The bytes of `path`, never more than `limit` + 1 of them read: bounded before anything
    parses them. Raises `FileTooLarge` (its message: ``NAME is larger than LIMIT bytes``) when
    the file holds more than `limit`, and `OSError` when it cannot be read."""
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"{path.name} is larger than {limit} bytes")
    return data


def temporary_path(path: Path) -> Path:
    """Where the new content of `path` is written before the rename: ``.<name>.tmp`` beside it,
    hidden, in the same folder (a rename is atomic only within one file system); what a crash
    leaves there is overwritten by the next write of `path`."""
    return path.with_name(f".{path.name}.tmp")


@contextlib.contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write the new content of `path` into. When the block ends, the file is
    flushed, fsynced and renamed over `path`, and the folder fsynced; when it raises, `path` is
    left as it was and the temporary file removed. The new file gets the permissions of any new
    file (0o666 less the umask), as ``open`` gives them."""
    tmp = temporary_path(path)
    out = tmp.open("wb")
    try:
        with out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        _replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes, *, mtime: float | None = None) -> None:
    """Replace `path` with `data` durably (`atomic_writer`). With `mtime` (Unix seconds), the file
    has that modification time when it appears (the media store orders its retention by its own
    clock)."""
    with atomic_writer(path) as out:
        out.write(data)
        if mtime is not None:
            out.flush()  # a write after the utime would set the time again
            os.utime(out.fileno(), (mtime, mtime))


def atomic_symlink(link: Path, target: Path) -> None:
    """Make `link` a symlink to `target` (stored as given, relative or not) in one step: a reader
    finds the old link or the new one, never none. Then the folder is fsynced."""
    tmp = temporary_path(link)
    tmp.unlink(missing_ok=True)  # left by a crash between the symlink and the rename
    os.symlink(target, tmp)
    try:
        _replace(tmp, link)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def move_into_place(written: Path, path: Path) -> None:
    """Rename the finished file or folder `written` to `path` (in the same file system) durably:
    `written`'s content is fsynced first (a folder's whole tree), then renamed, then `path`'s
    folder fsynced. An existing file (or empty folder) at `path` is replaced."""
    if written.is_dir():
        fsync_tree(written)
    else:
        _fsync_path(written)
    _replace(written, path)


def fsync_tree(folder: Path) -> None:
    """fsync every file and folder under `folder`, `folder` included."""
    for root, _, files in os.walk(folder):
        for name in files:
            _fsync_path(Path(root) / name)
        fsync_dir(Path(root))


def fsync_dir(path: Path) -> None:
    """fsync the folder `path`: the names in it (a file created, renamed or removed) survive a
    power cut."""
    _fsync_path(path)


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(source: Path, target: Path) -> None:
    """The one ``os.replace`` of the packages: `source` takes `target`'s name, then the folder of
    `target` is fsynced so that the rename is on disk."""
    os.replace(source, target)
    fsync_dir(target.parent)
