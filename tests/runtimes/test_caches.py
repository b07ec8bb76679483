"""`runtimes.caches`: a backend's cache pruned to what the installed versions use, then within its
bound, oldest first, never what the current and previous versions use; on a cache declared as a
plugin would declare one (`runtimes.base.Cache`), so every backend's is pruned the same way.
The in-tree caches, pruned by the bundle store's gc, are tested in tests/agent/bundles/test_store.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtimes.base import Backend, BackendConfig, Cache, CacheEntry, RuntimeInfo
from runtimes.caches import MIB, InUse, prune

KIB = 1024


def _entries(folder: Path) -> list[CacheEntry]:
    """A plugin's cache: ``<model sha>-<anything>.bin``, or ``orphan-*.bin`` whose model is unknown."""
    found = []
    for path in sorted(folder.glob("*.bin")):
        model = path.name.split("-")[0]
        found.append(CacheEntry(None if model == "orphan" else model, (path,)))
    return found


NPU_CACHE: Cache[BackendConfig] = Cache("compiled", folder=lambda config: None, entries=_entries)


def _entry(folder: Path, name: str, kib: int, mtime: float) -> Path:
    path = folder / f"{name}.bin"
    path.write_bytes(b"\0" * kib * KIB)
    os.utime(path, (mtime, mtime))
    return path


def test_a_cache_keeps_what_installed_versions_use_within_its_bound(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    current, previous, kept, gone = "c" * 64, "p" * 64, "k" * 64, "g" * 64
    _entry(cache, f"{current}-a", 300, mtime=100)  # the oldest of all, but the current version's
    _entry(cache, f"{previous}-a", 300, mtime=200)
    _entry(cache, "orphan-1", 100, mtime=250)  # its model unknown: goes by age only
    _entry(cache, f"{kept}-old", 300, mtime=300)
    _entry(cache, f"{kept}-new", 300, mtime=600)
    _entry(cache, f"{gone}-a", 300, mtime=700)  # a removed version's: goes whatever its age
    (cache / "shared-timing.cache").write_bytes(b"\0" * 900 * KIB)  # not an entry: never touched
    models = [
        InUse(tmp_path / "v1" / "m.onnx", current, protected=True),
        InUse(tmp_path / "v2" / "m.onnx", previous, protected=True),
        InUse(tmp_path / "v3" / "m.onnx", kept),
    ]
    removed = prune(NPU_CACHE, cache, models, max_mb=1)
    assert sorted(p.name for p in removed) == sorted([f"{gone}-a.bin", "orphan-1.bin", f"{kept}-old.bin"])
    left = sorted(p.name for p in cache.iterdir())
    assert left == sorted([f"{current}-a.bin", f"{previous}-a.bin", f"{kept}-new.bin", "shared-timing.cache"])
    assert sum(p.stat().st_size for p in cache.glob("*.bin")) <= 1 * MIB


def test_the_current_and_previous_versions_entries_stay_over_the_bound(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    _entry(cache, "c" * 64 + "-a", 700, mtime=1)
    _entry(cache, "p" * 64 + "-a", 700, mtime=2)
    _entry(cache, "k" * 64 + "-a", 10, mtime=3)
    models = [InUse(tmp_path / "c", "c" * 64, True), InUse(tmp_path / "p", "p" * 64, True), InUse(tmp_path, "k" * 64)]
    assert [p.name for p in prune(NPU_CACHE, cache, models, max_mb=1)] == ["k" * 64 + "-a.bin"]
    assert "over its 1 MiB: the current and previous versions use it all" in caplog.text


def test_an_entry_named_by_the_leading_digits_of_its_model_is_its_model_s(tmp_path: Path) -> None:
    """A calibration cache keeps only 16 hex digits of its model's sha256 in its name."""
    cache = tmp_path / "cache"
    cache.mkdir()
    _entry(cache, "ab" * 8 + "-calibration", 1, mtime=1)
    _entry(cache, "cd" * 8 + "-calibration", 1, mtime=1)
    removed = prune(NPU_CACHE, cache, [InUse(tmp_path, "ab" * 32)], max_mb=1)
    assert [p.name for p in removed] == ["cd" * 8 + "-calibration.bin"]


def test_a_cache_hashes_a_model_its_own_way(tmp_path: Path) -> None:
    """`Cache.model_hash`: the entry is named by a hash the manifest does not give (OpenVINO's IR:
    the .xml then the .bin); the manifest's sha256 would not find it."""
    cache = tmp_path / "cache"
    cache.mkdir()
    _entry(cache, "e" * 64 + "-a", 1, mtime=1)
    own = Cache[BackendConfig](
        "compiled", folder=lambda config: None, entries=_entries, model_hash=lambda p, s: "e" * 64
    )
    assert prune(own, cache, [InUse(tmp_path / "m.xml", "d" * 64)], max_mb=1) == []
    assert len(prune(NPU_CACHE, cache, [InUse(tmp_path / "m.xml", "d" * 64)], max_mb=1)) == 1


def test_a_missing_folder_is_nothing_to_prune(tmp_path: Path) -> None:
    assert prune(NPU_CACHE, tmp_path / "none", [], max_mb=0) == []


def test_a_backend_declares_its_caches_in_its_entry() -> None:
    class NpuConfig(BackendConfig):
        type: str = "npu"

    def load(path: Path, config: NpuConfig, options: object) -> None:
        raise NotImplementedError

    entry = Backend(
        name="npu", config=NpuConfig, summary="An NPU.", formats=("onnx",), rank={}, libraries=("npu_sdk",),
        availability=lambda: RuntimeInfo("npu", False), load=load, caches=(NPU_CACHE,),
    )  # fmt: skip
    assert entry.caches == (NPU_CACHE,)
    with pytest.raises(ValueError, match=r"npu: caches: expected a tuple of runtimes\.base\.Cache"):
        Backend(**{**entry.__dict__, "caches": ("compiled",)})
