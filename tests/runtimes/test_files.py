"""`runtimes.files`: the file hash against hashlib's, and the durable writes: the old content
survives a write that fails, no temporary file is left, and the file is fsynced before the rename
and its folder after it (seen through a recording `os.fsync`)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from runtimes import files
from runtimes.files import (
    CHUNK,
    atomic_symlink,
    atomic_write,
    atomic_writer,
    move_into_place,
    sha256_file,
    temporary_path,
)


class Recorder:
    """Stands in for `os.fsync` and `os.replace` (calling the real ones) and notes, in order,
    what each did: ``("fsync", inode)`` (the inode the fd is open on) and ``("replace", name)``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps: list[tuple[str, int | str]] = []
        real_fsync, real_replace = os.fsync, os.replace

        def fsync(fd: int) -> None:
            self.steps.append(("fsync", os.fstat(fd).st_ino))
            real_fsync(fd)

        def replace(source: str | Path, target: str | Path) -> None:
            self.steps.append(("replace", Path(target).name))
            real_replace(source, target)

        monkeypatch.setattr(files.os, "fsync", fsync)
        monkeypatch.setattr(files.os, "replace", replace)


def test_the_hash_of_a_file_of_several_chunks_is_hashlib_s(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK + 12345)
    (tmp_path / "model.onnx").write_bytes(data)
    assert sha256_file(tmp_path / "model.onnx") == hashlib.sha256(data).hexdigest()
    (tmp_path / "model.bin").write_bytes(b"weights")
    both = sha256_file(tmp_path / "model.onnx", tmp_path / "model.bin")
    assert both == hashlib.sha256(data + b"weights").hexdigest(), "several files hash as one stream"
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_a_folder_or_a_missing_file_cannot_be_hashed(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        sha256_file(tmp_path)
    with pytest.raises(OSError):
        sha256_file(tmp_path / "missing")


def test_a_write_fsyncs_the_file_then_renames_then_fsyncs_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "deployment.json"
    target.write_bytes(b"old")
    recorder = Recorder(monkeypatch)
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    written, folder = target.stat().st_ino, tmp_path.stat().st_ino
    assert recorder.steps == [("fsync", written), ("replace", "deployment.json"), ("fsync", folder)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deployment.json"]


def test_a_write_that_fails_midway_leaves_the_old_content_and_no_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "bundle.tar"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk gone"), atomic_writer(target) as out:
        out.write(b"half of the new")
        raise RuntimeError("disk gone")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle.tar"]


def test_a_rename_that_fails_leaves_the_old_content_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "followed.json"
    target.write_bytes(b"old")

    def power_cut(source: str | Path, target: str | Path) -> None:
        raise OSError(5, "power cut")

    monkeypatch.setattr(files.os, "replace", power_cut)
    with pytest.raises(OSError, match="power cut"):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["followed.json"]


def test_a_new_file_gets_the_permissions_open_gives(tmp_path: Path) -> None:
    """0o666 less the umask, as `Path.write_bytes` gives them: the helper changes no one's modes."""
    (tmp_path / "plain").write_bytes(b"x")
    atomic_write(tmp_path / "atomic", b"x")
    assert stat.S_IMODE((tmp_path / "atomic").stat().st_mode) == stat.S_IMODE((tmp_path / "plain").stat().st_mode)


def test_a_write_with_mtime_appears_with_that_modification_time(tmp_path: Path) -> None:
    atomic_write(tmp_path / "a.jpg", b"jpeg" * 1000, mtime=1_700_000_000.0)
    assert (tmp_path / "a.jpg").stat().st_mtime == 1_700_000_000.0


def test_a_leftover_temporary_file_is_overwritten(tmp_path: Path) -> None:
    temporary_path(tmp_path / "control.json").write_bytes(b"left by a crash, longer than the new content")
    atomic_write(tmp_path / "control.json", b"{}")
    assert (tmp_path / "control.json").read_bytes() == b"{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control.json"]


def test_a_symlink_is_swapped_in_one_rename_then_the_folder_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "versions" / "a").mkdir(parents=True)
    (tmp_path / "versions" / "b").mkdir()
    atomic_symlink(tmp_path / "current", Path("versions") / "a")
    os.symlink("versions/a", temporary_path(tmp_path / "previous"))  # left by a crash
    recorder = Recorder(monkeypatch)
    atomic_symlink(tmp_path / "current", Path("versions") / "b")
    atomic_symlink(tmp_path / "previous", Path("versions") / "a")
    assert os.readlink(tmp_path / "current") == "versions/b" and os.readlink(tmp_path / "previous") == "versions/a"
    folder = tmp_path.stat().st_ino
    assert recorder.steps == [("replace", "current"), ("fsync", folder), ("replace", "previous"), ("fsync", folder)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current", "previous", "versions"]


def test_a_folder_moved_into_place_has_its_tree_fsynced_before_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    staging = tmp_path / "versions" / "abc.tmp"
    (staging / "calibration").mkdir(parents=True)
    (staging / "model.onnx").write_bytes(b"onnx")
    (staging / "calibration" / "0.jpg").write_bytes(b"jpeg")
    inodes = {p.relative_to(staging).as_posix(): p.stat().st_ino for p in [staging, *staging.rglob("*")]}
    recorder = Recorder(monkeypatch)
    move_into_place(staging, tmp_path / "versions" / "abc")
    *synced, rename, last = recorder.steps
    assert sorted(inode for _, inode in synced) == sorted(inodes.values()), "every file and folder of the tree"
    assert (rename, last) == (("replace", "abc"), ("fsync", (tmp_path / "versions").stat().st_ino))
    assert (tmp_path / "versions" / "abc" / "calibration" / "0.jpg").read_bytes() == b"jpeg"


def test_a_file_moved_into_place_is_fsynced_renamed_and_its_folder_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = tmp_path / ".0000000000000001.part.mp4"
    written.write_bytes(b"clip")
    inode = written.stat().st_ino
    recorder = Recorder(monkeypatch)
    move_into_place(written, tmp_path / "0000000000000001.mp4")
    folder = tmp_path.stat().st_ino
    assert recorder.steps == [("fsync", inode), ("replace", "0000000000000001.mp4"), ("fsync", folder)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0000000000000001.mp4"]


@pytest.mark.parametrize(("size", "refused"), [(0, False), (16, False), (17, True)])
def test_read_at_most_takes_up_to_its_limit_and_refuses_one_byte_more(tmp_path: Path, size: int, refused: bool) -> None:
    path = tmp_path / "record.json"
    path.write_bytes(b"x" * size)
    if refused:  # fails on: `>=` for `>` (a file of exactly the limit refused), or no check at all
        with pytest.raises(files.FileTooLarge, match=r"^record\.json is larger than 16 bytes$"):
            files.read_at_most(path, 16)
    else:
        assert files.read_at_most(path, 16) == b"x" * size
    with pytest.raises(FileNotFoundError):
        files.read_at_most(tmp_path / "missing.json", 16)
