"""`agent.daemon.media`: snapshots kept as files, retention by size and age (an injected clock),
event ids only (never a path), a write the disk refuses reported, not raised."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config.models import MediaSection
from agent.daemon.media import MIB, MediaStore
from runtimes.files import temporary_path


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def ident(i: int) -> str:
    return f"{i:016x}"


def test_a_snapshot_is_kept_under_its_event_id_and_read_back(tmp_path: Path) -> None:
    store = MediaStore(tmp_path / "media", MediaSection())
    assert store.put(ident(1), b"\xff\xd8one") == "0000000000000001.jpg"
    assert (tmp_path / "media" / "0000000000000001.jpg").read_bytes() == b"\xff\xd8one"
    assert store.get(ident(1)) == b"\xff\xd8one"
    assert store.get(ident(2)) is None
    assert store.get("../../etc/passwd") is None, "an id is a file name, never a path"
    with pytest.raises(ValueError):
        store.put("../x", b"")
    assert store.usage().files == 1 and store.usage().bytes == 5


def test_the_oldest_go_first_past_max_mb(tmp_path: Path) -> None:
    clock = Clock()
    store = MediaStore(tmp_path / "media", MediaSection(max_mb=0.1), clock)  # 104857 bytes
    for i in range(12):
        clock.now += 1
        store.put(ident(i), b"x" * 10_000)
    kept = sorted(p.name for p in (tmp_path / "media").glob("*.jpg"))
    assert kept == [f"{ident(i)}.jpg" for i in range(2, 12)], "ten of 10 kB fit in 0.1 MiB; the two oldest went"
    assert store.usage().bytes <= 0.1 * MIB


def test_snapshots_past_max_age_go(tmp_path: Path) -> None:
    clock = Clock()
    store = MediaStore(tmp_path / "media", MediaSection(max_age_h=1), clock)
    store.put(ident(1), b"old")
    clock.now += 1800
    store.put(ident(2), b"newer")
    clock.now += 1800  # the first is exactly an hour old: kept
    store.put(ident(3), b"new")
    assert store.get(ident(1)) == b"old"
    clock.now += 1
    store.put(ident(4), b"newest")
    assert store.get(ident(1)) is None and store.get(ident(2)) == b"newer"
    usage = store.usage()
    assert usage.files == 3 and usage.oldest_age_s == pytest.approx(1801)


def test_a_partial_write_is_cleared_at_start_and_a_refused_one_reported(tmp_path: Path) -> None:
    folder = tmp_path / "media"
    folder.mkdir()
    temporary_path(folder / f"{ident(7)}.jpg").write_bytes(b"half")
    (folder / f"{ident(6)}.jpg.tmp").write_bytes(b"half")  # what versions before runtimes.files left
    store = MediaStore(folder, MediaSection())
    assert not list(folder.glob("*.tmp"))
    temporary_path(folder / f"{ident(8)}.jpg").mkdir()  # where the write goes: a folder, so the disk refuses it
    assert store.put(ident(8), b"jpeg") is None
    assert store.problem is not None and "refuses writes" in store.problem
    assert store.put(ident(9), b"jpeg") == f"{ident(9)}.jpg"
    assert store.problem is None
