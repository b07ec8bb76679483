"""Stores with fake versions (a manifest each) for the tests of recovery, gc and rollback."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.bundles.store import Store


def fake_version(store: Store, sha: str, mtime: float) -> None:
    """A version folder `sha` holding only a manifest, last changed at `mtime` (Unix seconds)."""
    folder = store.versions / sha
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": "x", "version": sha}))
    os.utime(folder, (mtime, mtime))


#: three versions' sha256s
A, B, C = "a" * 64, "b" * 64, "c" * 64


def two_versions(tmp_path: Path) -> Store:
    """A store serving B with A as previous (fake versions: a manifest each)."""
    store = Store(tmp_path / "state").ensure()
    fake_version(store, A, 1000)
    fake_version(store, B, 2000)
    store.switch(A)
    store.switch(B)
    return store
