"""`agent.daemon.media`: snapshots kept as files, retention by size and age (an injected clock),
event ids only (never a path), a write the disk refuses reported, not raised, and the free
space floor (an injected free-space reader over the real files, deleted for real)."""

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


class Disk:
    """An injected free-space reader: a disk of `capacity` bytes holding the media folder's
    real files and `other` bytes of everything else (the outbox, bundles)."""

    def __init__(self, capacity: int, other: int = 0) -> None:
        self.capacity, self.other = capacity, other

    def __call__(self, folder: Path) -> int:
        held = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        return self.capacity - self.other - held


def test_under_the_free_space_floor_the_oldest_go_and_nothing_new_is_kept(tmp_path: Path) -> None:
    clock, disk, folder = Clock(), Disk(MIB + 300_000), tmp_path / "media"
    store = MediaStore(folder, MediaSection(min_free_mb=1), clock, disk)
    for i in range(3):
        clock.now += 1
        assert store.put(ident(i), b"x" * 100_000) is not None
    assert disk(folder) == MIB, "three fit above the floor"
    clock.now += 1
    assert store.put(ident(3), b"x" * 100_000) == f"{ident(3)}.jpg"
    assert sorted(p.name for p in folder.iterdir()) == [f"{ident(i)}.jpg" for i in (1, 2, 3)], "the oldest went"
    assert disk(folder) >= MIB and store.problem is None
    disk.other = 500_000  # the outbox grew: even without media the disk is under the floor
    clock.now += 1
    assert store.put(ident(4), b"x" * 100_000) is None, "not kept: it would take the disk under the floor"
    assert list(folder.iterdir()) == [], "every file went to give the room back"
    assert store.problem is not None and "events.media.min_free_mb" in store.problem
    assert store.usage().problem == store.problem, "where the page reads it"
    clip = folder / f".{ident(5)}.part.mp4"
    clip.write_bytes(b"c" * 1000)
    assert store.keep_clip(ident(5), clip) is None, "a clip is not kept either (the recorder deletes it)"
    disk.other = 0
    assert store.put(ident(6), b"x" * 100_000) == f"{ident(6)}.jpg"
    assert store.problem is None and store.usage().problem is None, "room again: kept, the problem gone"


def test_no_floor_with_min_free_mb_0(tmp_path: Path) -> None:
    store = MediaStore(tmp_path / "media", MediaSection(min_free_mb=0), Clock(), Disk(0))
    assert store.put(ident(1), b"jpeg") == f"{ident(1)}.jpg"


def test_a_snapshot_that_would_cross_the_floor_is_not_written(tmp_path: Path) -> None:
    """50 kB above the floor, an empty store: a 100 kB snapshot is refused, not written and
    then deleted as the oldest file (which would leave the event naming a file that is gone)."""
    store = MediaStore(tmp_path / "media", MediaSection(min_free_mb=1), Clock(), Disk(MIB + 50_000))
    assert store.put(ident(1), b"x" * 100_000) is None
    assert store.put(ident(2), b"x" * 50_000) == f"{ident(2)}.jpg", "one that fits is kept"
