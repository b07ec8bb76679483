"""Stores with fake versions (a manifest each) for the tests of recovery, gc and rollback, and
deployment records walked to the state a test needs."""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from agent.bundles.record import TRANSITIONS, Deployment, State
from agent.bundles.store import Store
from agent.errors import BundleError


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


def walked_to(record: Deployment, state: State, error: BundleError | None = None) -> Deployment:
    """`record` moved to `state` by the shortest way `TRANSITIONS` allows (a record left there by
    a crash, as recovery finds it); `error` is given with the last step."""
    before: dict[State, tuple[State, ...]] = {record.state: ()}  # the steps that reach each state
    queue = deque([record.state])
    while queue:
        here = queue.popleft()
        for step in sorted(TRANSITIONS[here]):
            if step == state:
                for passed in before[here]:
                    record = record.to(passed)
                return record.to(state, error)
            if step not in before:
                before[step] = (*before[here], step)
                queue.append(step)
    raise ValueError(f"TRANSITIONS has no way from {record.state} to {state}")
