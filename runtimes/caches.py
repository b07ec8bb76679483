"""Pruning a backend's cache (`runtimes.base.Cache`: TensorRT's engines, OpenVINO's compiled
models, any a plugin declares) down to what the installed versions use, within its size bound.

`prune` is handed the model files of every installed version (`InUse`; those of the current and
previous versions `protected`). It removes, in that order:

1. every entry made for a model that no installed version has (its model's sha256, as the
   cache's `Cache.model_hash` computes it for each installed file, is none of theirs): a device
   that gets a new model every week would otherwise keep every engine it ever built;
2. then, while the entries left take more than `max_mb`, the oldest (by their files' newest
   modification time) that the current and previous versions do not use; those are never
   removed, even when they alone pass the bound (the bound is then exceeded, and logged).

An entry whose model the cache cannot tell (`CacheEntry.model` None) is kept by step 1 and
counts, and goes by age, in step 2. Files the cache does not list are never touched. A file
that cannot be removed or measured is logged and skipped: pruning never fails its caller.
`runtimes.registry.prune_caches` runs it over every registered backend's caches; the bundle
store calls that whenever it removes versions (`agent.bundles.store.Store.gc`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtimes.base import Cache, CacheEntry

log = logging.getLogger(__name__)

MIB = 1 << 20


@dataclass(frozen=True)
class InUse:
    """A model file an installed version serves: its path, the sha256 its manifest gives it, and
    whether the version is the current or the previous one (its cache entries are never pruned)."""

    path: Path
    sha256: str
    protected: bool = False


def _uses(entry: CacheEntry, hashes: set[str]) -> bool:
    """Whether `entry` was made for one of the models of `hashes` (its name may keep a prefix)."""
    model = entry.model
    return model is not None and any(h.startswith(model) for h in hashes)


def _size(entry: CacheEntry) -> int:
    total = 0
    for path in entry.files:
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            continue
    return total


def _age(entry: CacheEntry) -> float:
    """When the entry was last written: its newest file's modification time (0 when none is left)."""
    times = []
    for path in entry.files:
        try:
            times.append(path.stat().st_mtime)
        except FileNotFoundError:
            continue
    return max(times, default=0.0)


def _remove(entry: CacheEntry) -> list[Path]:
    removed = []
    for path in entry.files:
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("cannot remove the cache file %s: %s", path, exc.strerror)
    return removed


def model_hashes(cache: Cache[Any], models: Sequence[InUse]) -> tuple[set[str], set[str]]:
    """The sha256s `cache` names the models of `models` by: all of them, and the protected ones.
    A file the cache cannot hash (a version whose weights are missing) counts by its manifest's."""
    every: set[str] = set()
    protected: set[str] = set()
    for model in models:
        try:
            digest = cache.model_hash(model.path, model.sha256)
        except OSError as exc:
            log.warning("cannot hash %s for the %s cache: %s", model.path, cache.name, exc.strerror)
            digest = model.sha256
        every.add(digest)
        if model.protected:
            protected.add(digest)
    return every, protected


def prune(cache: Cache[Any], folder: Path, models: Sequence[InUse], max_mb: int) -> list[Path]:
    """Prune `cache`'s entries in `folder` (see the module docstring); returns the files removed."""
    if not folder.is_dir():
        return []
    every, protected = model_hashes(cache, models)
    entries = list(cache.entries(folder))
    removed: list[Path] = []
    kept = []
    for entry in entries:
        if entry.model is not None and not _uses(entry, every):
            removed += _remove(entry)
        else:
            kept.append(entry)
    sizes = {id(entry): _size(entry) for entry in kept}
    total, bound = sum(sizes.values()), max_mb * MIB
    for entry in sorted(kept, key=_age):
        if total <= bound:
            break
        if _uses(entry, protected):
            continue
        removed += _remove(entry)
        total -= sizes[id(entry)]
    if total > bound:
        log.warning(
            "the %s cache in %s keeps %.0f MiB, over its %d MiB: the current and previous versions use it all",
            cache.name,
            folder,
            total / MIB,
            max_mb,
        )
    if removed:
        log.info("pruned %d file(s) from the %s cache in %s", len(removed), cache.name, folder)
    return removed
