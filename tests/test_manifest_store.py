"""Manifest validation, its exported schema, and store housekeeping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.bundles.manifest import Manifest, schema_json
from agent.bundles.record import Deployment
from agent.bundles.store import Store
from tests.conftest import REPO

GOOD = {
    "schema_version": 1,
    "name": "people-counter",
    "version": "1.4.0-rc.1",
    "created": "2026-11-29T12:00:00+00:00",
    "decoder": "yolov8",
    "input": {"size": [640, 640], "color": "RGB", "resize": "letterbox"},
    "labels": ["person"],
    "artifacts": [{"path": "m.onnx", "format": "onnx", "precision": "fp32", "sha256": "a" * 64, "size": 10}],
}


def test_a_valid_manifest_round_trips() -> None:
    manifest = Manifest.model_validate(GOOD)
    assert Manifest.model_validate(json.loads(manifest.to_bytes())) == manifest
    assert manifest.thresholds.conf == 0.25 and manifest.reference.path == "reference.npz"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": "1.4"}, "not a semantic version"),
        ({"schema_version": 2}, "schema_version"),
        ({"name": "../evil"}, "name"),
        ({"extra": 1}, "Extra inputs are not permitted"),
        ({"labels": []}, "labels"),
        ({"artifacts": [{**GOOD["artifacts"][0], "path": "../m.onnx"}]}, "plain file name"),
        ({"artifacts": [{**GOOD["artifacts"][0], "sha256": "XYZ"}]}, "sha256"),
        ({"artifacts": [GOOD["artifacts"][0], GOOD["artifacts"][0]]}, "must be unique"),
        ({"files": [{"path": "etc/passwd", "sha256": "b" * 64, "size": 1}]}, "calibration/<name>"),
        (
            {"tensorrt_profile": {"min": [1, 3, 640, 640], "opt": [1, 3, 320, 320], "max": [1, 3, 640, 640]}},
            "min <= opt <= max",
        ),
        ({"thresholds": {"conf": 1.5}}, "conf"),
    ],
)
def test_invalid_manifests_name_the_field(change: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Manifest.model_validate({**GOOD, **change})


@pytest.mark.schema_docs
def test_exported_schema_is_current() -> None:
    """docs/manifest.schema.json is regenerated with `python -m agent.bundles.manifest`."""
    assert (REPO / "docs" / "manifest.schema.json").read_text() == schema_json()


def fake_version(store: Store, sha: str, mtime: float) -> None:
    folder = store.versions / sha
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"name": "x", "version": sha}))
    import os

    os.utime(folder, (mtime, mtime))


def test_gc_keeps_newest_and_never_current_or_previous(tmp_path: Path) -> None:
    store = Store(tmp_path, keep=2).ensure()
    for i, sha in enumerate(["a" * 64, "b" * 64, "c" * 64, "d" * 64]):
        fake_version(store, sha, 1000 + i)
    store.switch("a" * 64)  # the oldest is current
    store.switch("b" * 64)  # ... and now previous
    store.switch("a" * 64)
    assert (store.current_sha(), store.previous_sha()) == ("a" * 64, "b" * 64)
    assert sorted(store.gc()) == ["c" * 64, "d" * 64]  # two kept: current and previous
    assert sorted(p.name for p in store.versions.iterdir()) == ["a" * 64, "b" * 64]
    store.keep = 3
    fake_version(store, "e" * 64, 2000)
    fake_version(store, "f" * 64, 3000)
    assert store.gc() == ["e" * 64]  # the newest other version stays


def test_recover_drops_dangling_pointers_and_partial_unpacks(tmp_path: Path) -> None:
    store = Store(tmp_path).ensure()
    fake_version(store, "a" * 64, 1000)
    store.switch("a" * 64)
    (store.versions / ("b" * 64 + ".tmp")).mkdir()
    import os

    os.symlink("versions/" + "c" * 64, tmp_path / "previous")  # points at nothing
    deployment = Deployment(id="d1", sha256="b" * 64, from_sha="a" * 64)
    deployment.to("INSTALLING")
    store.record(deployment)
    recovered = store.recover()
    assert recovered is not None and recovered.state == "REJECTED"
    assert recovered.error == {"code": "INTERRUPTED", "message": "the agent stopped during INSTALLING"}
    assert store.current_sha() == "a" * 64 and store.previous_sha() is None
    assert not (tmp_path / "previous").is_symlink()
    assert not list(store.versions.glob("*.tmp"))
    assert store.recover() is None  # nothing left to do


def test_gc_goes_by_age_not_by_name_and_leaves_partial_unpacks_to_recovery(tmp_path: Path) -> None:
    store = Store(tmp_path, keep=3).ensure()
    for sha, mtime in (("a" * 64, 1000), ("b" * 64, 1001), ("e" * 64, 3000), ("f" * 64, 2000)):
        fake_version(store, sha, mtime)
    (store.versions / ("9" * 64 + ".tmp")).mkdir()  # an unpack in progress: not a version
    store.switch("a" * 64)
    store.switch("b" * 64)
    assert store.gc() == ["f" * 64], "the older of the two others goes, although its name sorts last"
    assert (store.versions / ("9" * 64 + ".tmp")).is_dir()


def test_rollback_swaps_current_and_previous(tmp_path: Path) -> None:
    store = Store(tmp_path).ensure()
    fake_version(store, "a" * 64, 1000)
    store.switch("a" * 64)
    with pytest.raises(LookupError, match="there is no previous version to roll back to"):
        store.rollback()
    fake_version(store, "b" * 64, 2000)
    store.switch("b" * 64)
    assert store.rollback() == "a" * 64
    assert (store.current_sha(), store.previous_sha()) == ("a" * 64, "b" * 64)
    assert store.rollback() == "b" * 64
    assert (store.current_sha(), store.previous_sha()) == ("b" * 64, "a" * 64)
