"""Stores with fake versions (a manifest each) for the tests of recovery, gc and rollback."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from agent.bundles.store import Store


def fake_version(store: Store, sha: str, mtime: float, models: Mapping[str, str] | None = None) -> None:
    """A version folder `sha` holding only a manifest, last changed at `mtime` (Unix seconds);
    `models` lists its artifacts (path -> sha256) when the test needs them (caches pruned by gc)."""
    folder = store.versions / sha
    folder.mkdir(parents=True)
    manifest: dict[str, object] = {"name": "x", "version": sha}
    if models is not None:
        manifest["artifacts"] = [{"path": path, "sha256": digest} for path, digest in models.items()]
    (folder / "manifest.json").write_text(json.dumps(manifest))
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
