"""`agent.bundles.store`: versions and pointers, gc, recovery after a crash at each state (on fake
versions), the pointer switch that never leaves the device without `current`; the backends'
caches (TensorRT's engines, OpenVINO's compiled models) pruned with the versions."""

from __future__ import annotations

import io
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import pytest
from testkit.store import A, B, C, fake_version, two_versions, walked_to

from agent.bundles.record import Deployment, State
from agent.bundles.store import Store, version_key
from agent.errors import ErrorCode, ErrorInfo
from runtimes.base import Precision
from runtimes.engine_cache import EngineCache, EngineKey, EngineRecord
from runtimes.files import sha256_file
from runtimes.openvino_backend import CompiledKey, OpenVINOConfig
from runtimes.openvino_backend import _store as store_compiled
from runtimes.registry import RuntimeSettings
from runtimes.tensorrt_backend import TensorRTConfig


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


def test_switching_to_the_current_version_keeps_the_previous_one(tmp_path: Path) -> None:
    """A switch to what is already current (an install of the version running) changes nothing:
    the rollback target stays. Catches a planted `switch` that always moves current to previous
    (then previous == current and the way back is lost)."""
    store = Store(tmp_path).ensure()
    fake_version(store, A, 1000)
    fake_version(store, B, 2000)
    store.switch(A)
    store.switch(A)
    assert (store.current_sha(), store.previous_sha()) == (A, None), "the first version has nothing to go back to"
    store.switch(B)
    store.switch(B)
    assert (store.current_sha(), store.previous_sha()) == (B, A)
    assert store.rollback() == A and (store.current_sha(), store.previous_sha()) == (A, B)


def test_recover_drops_dangling_pointers_and_partial_unpacks(tmp_path: Path) -> None:
    store = Store(tmp_path).ensure()
    fake_version(store, "a" * 64, 1000)
    store.switch("a" * 64)
    (store.versions / ("b" * 64 + ".tmp")).mkdir()
    import os

    os.symlink("versions/" + "c" * 64, tmp_path / "previous")  # points at nothing
    deployment = Deployment(id="d1", sha256="b" * 64, from_sha="a" * 64).to(State.VERIFYING).to(State.INSTALLING)
    store.record(deployment)
    recovered = store.recover()
    assert recovered is not None and recovered.state == "REJECTED"
    assert recovered.error == ErrorInfo(ErrorCode.INTERRUPTED, "the agent stopped during INSTALLING")
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


def test_a_pointer_switch_never_leaves_the_device_without_current(tmp_path: Path, monkeypatch) -> None:
    """The switch replaces `current` with one rename: if the process dies before it (here: the
    new link cannot be made), `current` still names the old version, never nothing."""
    from testkit.store import fake_version

    store = Store(tmp_path).ensure()
    fake_version(store, "a" * 64, 1000)
    fake_version(store, "b" * 64, 2000)
    store.switch("a" * 64)

    make_link = os.symlink

    def power_cut(target: object, link: object) -> None:  # the power fails as the new current is made
        if "current" in str(link):
            raise OSError("power cut")
        make_link(target, link)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "symlink", power_cut)
    with pytest.raises(OSError, match="power cut"):
        store.switch("b" * 64)
    assert store.current_sha() == "a" * 64


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda root: (root / "current").write_text("not a link"), "current is not a link to a version (a file)"),
        (lambda root: os.symlink("/etc", root / "current"), "current points outside the store (/etc)"),
        (lambda root: os.symlink("versions/" + C, root / "current"), "current points at version cccccccccccc"),
    ],
    ids=["regular file", "outside the store", "dangling"],
)
def test_a_broken_current_falls_back_to_previous_and_says_so(tmp_path: Path, make, words: str) -> None:
    store = two_versions(tmp_path)
    (store.root / "current").unlink()
    make(store.root)
    assert store.current_sha() is None
    store.recover()
    assert store.current_sha() == A, "the previous version serves"
    assert len(store.problems) == 1 and store.problems[0].startswith(words), store.problems
    assert "serving the previous version x" in store.problems[0]


def test_recovery_never_deletes_a_version_it_cannot_prove_partial(tmp_path: Path) -> None:
    store = two_versions(tmp_path)
    (store.root / "deployment.json").write_text(json.dumps({"id": "x", "sha256": A, "state": "VERIFYING"}))
    recovered = store.recover()
    assert recovered is not None and recovered.state == "REJECTED"
    assert (store.current_sha(), store.previous_sha()) == (B, A), "a VERIFYING record proves nothing switched"
    assert (store.versions / A).is_dir() and (store.versions / B).is_dir()


def test_a_truncated_record_is_reported(tmp_path: Path) -> None:
    store = two_versions(tmp_path)
    (store.root / "deployment.json").write_text('{"id": "d1", "sha256": "aa')
    assert store.recover() is None
    assert store.problems and "truncated?" in store.problems[0]
    assert store.current_sha() == B


def test_a_power_cut_while_recording_leaves_the_last_record_whole(tmp_path: Path, monkeypatch) -> None:
    """The record is written beside and renamed over: the power going out before the rename
    (a test double of os.replace that raises) leaves the previous record, never a torn one."""
    store = two_versions(tmp_path)
    store.record(Deployment(id="d1", sha256=B, state=State.SUCCEEDED))
    renamed: list[str] = []
    real_replace = os.replace

    def power_cut(source: str | Path, target: str | Path) -> None:
        renamed.append(Path(target).name)
        raise OSError(5, "power cut")

    monkeypatch.setattr(os, "replace", power_cut)
    with pytest.raises(OSError, match="power cut"):
        store.record(Deployment(id="d2", sha256=A, state=State.DOWNLOADING, name="x" * 10_000))
    assert renamed == ["deployment.json"], "the record is put in place by a rename"
    monkeypatch.setattr(os, "replace", real_replace)
    last = store.last_deployment()
    assert last is not None and (last.id, last.state) == ("d1", State.SUCCEEDED)


def test_semantic_version_order() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.9.0",
        "1.10.0",
    ]
    assert sorted(reversed(ordered), key=version_key) == ordered
    assert version_key("2.0.0+build.7") == version_key("2.0.0+build.8")


# state at the crash, whether the new version C was switched in, probation_s ->
# the state it ends in, its code, the words, (current, previous) after, whether C is kept
STOPPED = "the agent stopped while the version was on probation"


DURING = "the agent stopped during "


# fmt: off
RECOVERIES = {
    "verifying": ("VERIFYING", False, 0, "REJECTED", "INTERRUPTED", DURING + "VERIFYING", (B, A), False),
    "installing": ("INSTALLING", False, 0, "REJECTED", "INTERRUPTED", DURING + "INSTALLING", (B, A), False),
    "activating, before the switch": ("ACTIVATING", False, 0, "ROLLED_BACK", "INTERRUPTED", DURING + "ACTIVATING", (B, A), False),  # noqa: E501
    "activating, switched": ("ACTIVATING", True, 0, "SUCCEEDED", None, None, (C, B), True),
    "activating, switched, probation to come": ("ACTIVATING", True, 60, "ROLLED_BACK", "PROBATION_FAILED", STOPPED, (B, A), False),  # noqa: E501
    "probation": ("PROBATION", True, 60, "ROLLED_BACK", "PROBATION_FAILED", STOPPED, (B, A), False),
}


@pytest.mark.parametrize("case", list(RECOVERIES))
def test_recovery_after_a_crash_at_each_state(tmp_path: Path, case: str) -> None:
    """The store's half of the SIGKILL table (test_bundles.py), on fake versions."""
    state, switched, probation_s, final, code, words, pointers, kept = RECOVERIES[case]
    store = two_versions(tmp_path)
    fake_version(store, C, 3000)
    deployment = Deployment(
        id="d", sha256=C, from_sha=B, previous_before=A, probation_s=probation_s, name="x", version="3.0.0"
    )
    if switched:
        store.switch(C)
    deployment = walked_to(deployment, State(state))
    store.record(deployment)
    recovered = store.recover()
    assert recovered is not None and recovered.state == final
    assert (recovered.error.code if recovered.error else None) == code
    assert words is None or (recovered.error is not None and recovered.error.message == words)
    assert store.last_deployment() is not None and store.last_deployment().state == final  # type: ignore[union-attr]
    assert (store.current_sha(), store.previous_sha()) == pointers
    assert (store.versions / C).is_dir() == kept
    assert (store.versions / A).is_dir() and (store.versions / B).is_dir()
    assert store.highest_version("x") == ("3.0.0" if final == "SUCCEEDED" else None)


def test_recovery_keeps_a_version_the_interrupted_deployment_did_not_bring(tmp_path: Path) -> None:
    """Pushing the version already serving (or the previous one) again and crashing while
    verifying must not remove it."""
    for sha in (B, A):
        store = two_versions(tmp_path / sha[:1])
        deployment = Deployment(id="d", sha256=sha, from_sha=B, previous_before=A, name="x", version="1")
        deployment = deployment.to(State.VERIFYING)
        store.record(deployment)
        assert store.recover() is not None
        assert (store.versions / sha).is_dir() and (store.current_sha(), store.previous_sha()) == (B, A)


def test_nothing_to_recover_after_a_final_state(tmp_path: Path) -> None:
    store = two_versions(tmp_path)
    deployment = Deployment(id="d", sha256=B, from_sha=A, name="x", version="2").to(State.SUCCEEDED)
    store.record(deployment)
    assert store.recover() is None and store.last_deployment().state == "SUCCEEDED"  # type: ignore[union-attr]


def test_undo_without_previous_before_keeps_the_newest_other_version_as_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A record written without `previous_before` (an older agent, a hand-made record) crashed
    in PROBATION: the version before `from_sha` is still installed, so it stays the rollback
    target instead of being lost (issue 29, 7)."""
    store = two_versions(tmp_path)  # current B, previous A
    fake_version(store, "d" * 64, 500)  # older than A: not the one to keep
    fake_version(store, C, 3000)
    deployment = Deployment(id="d", sha256=C, from_sha=B, probation_s=60, name="x", version="3.0.0")
    store.switch(C)  # current C, previous B
    deployment = walked_to(deployment, State.PROBATION)
    store.record(deployment)
    with caplog.at_level(logging.WARNING):
        recovered = store.recover()
    assert recovered is not None and recovered.state == "ROLLED_BACK"
    assert (store.current_sha(), store.previous_sha()) == (B, A)
    assert any("previous_before" in r.getMessage() and A[:12] in r.getMessage() for r in caplog.records)
    assert store.rollback() == A, "rollback finds its target"


# -- the backends' caches, pruned with the versions ---------------------------------------------

KIB = 1024


def _aged(mtime: float, *paths: Path) -> None:
    for path in paths:
        os.utime(path, (mtime, mtime))


def _engine(cache: EngineCache, model: str, precision: Precision, kib: int, mtime: float) -> EngineKey:
    key = EngineKey(model, "10.13.0.35", "Orin", (8, 7), precision)
    cache.store(EngineRecord(key), b"\0" * kib * KIB)
    _aged(mtime, cache.engine_path(key), cache.folder / f"{key.digest}.json")
    return key


def _left(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _four_versions(store: Store, models: list[str]) -> None:
    """Versions A, B, C, D (oldest first) of one model each, D current and C previous: with
    ``keep=3`` gc removes A."""
    for sha, model, mtime in zip((A, B, C, "d" * 64), models, (1000, 2000, 3000, 4000), strict=True):
        fake_version(store, sha, mtime, {"model.onnx": model} if model else {})
    store.switch(C)
    store.switch("d" * 64)


def test_gc_prunes_tensorrt_s_engines_to_what_installed_versions_use_within_the_bound(tmp_path: Path) -> None:
    folder = tmp_path / "engines"
    settings = RuntimeSettings(tensorrt=TensorRTConfig(engine_cache_dir=folder, engine_cache_max_mb=1))
    store = Store(tmp_path / "state", keep=3, runtimes=settings).ensure()
    m1, m2, m3, m4, loose = ("1" * 64, "2" * 64, "3" * 64, "4" * 64, "9" * 64)
    _four_versions(store, [m1, m2, m3, m4])
    cache = EngineCache(folder)
    removed_version = _engine(cache, m1, "fp16", 100, mtime=5)  # A's: A goes, so does its engine
    cache.record_failure(replace(removed_version, precision="int8"), "no calibration images")
    cache.calibration_cache(removed_version).write_bytes(b"calibration")
    _engine(cache, loose, "fp16", 100, mtime=90)  # `engine build` of a model no version has
    current = _engine(cache, m4, "fp16", 300, mtime=10)  # the oldest of all, but D's: always kept
    previous = _engine(cache, m3, "fp16", 300, mtime=20)
    orphan = folder / ("f" * 32 + ".engine")  # its record lost in a crash: goes by age
    orphan.write_bytes(b"\0" * 300 * KIB)
    _aged(30, orphan)
    older = _engine(cache, m2, "fp32", 300, mtime=40)  # B's oldest: beyond the 1 MiB, it goes
    newer = _engine(cache, m2, "fp16", 300, mtime=60)
    cache.calibration_cache(current).write_bytes(b"calibration")
    timing = cache.timing_cache(current)
    timing.write_bytes(b"\0" * 600 * KIB)  # shared by every model here: never pruned

    assert store.gc() == [A]

    kept = {key: cache.lookup(key) is not None for key in (current, previous, older, newer)}
    assert kept == {current: True, previous: True, older: False, newer: True}
    expected = {f"{k.digest}{suffix}" for k in (current, previous, newer) for suffix in (".engine", ".json")}
    assert _left(folder) == expected | {cache.calibration_cache(current).name, timing.name}
    engines = sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".engine", ".json"))
    assert engines <= 1024 * KIB
    store.remove_version(B)  # a version removed otherwise (its activation failed) takes its engines too
    assert cache.lookup(newer) is None and cache.lookup(current) is not None and cache.lookup(previous) is not None


def _compiled(folder: Path, model: str, hint: str, kib: int, mtime: float) -> CompiledKey:
    key = CompiledKey(model, "2025.3.0", "CPU", "Intel(R) Core(TM) i5", hint, 0, 1 if hint == "LATENCY" else 2)

    class Compiled:  # what `OpenVINOBackend` caches: its export
        def export_model(self) -> io.BytesIO:
            return io.BytesIO(b"\0" * kib * KIB)

    store_compiled(Compiled(), key, {"names": "{0: 'a'}"}, folder)
    _aged(mtime, folder / f"{key.digest}.blob", folder / f"{key.digest}.json")
    return key


def test_gc_prunes_openvino_s_compiled_models_to_what_installed_versions_use_within_the_bound(
    tmp_path: Path,
) -> None:
    """An IR's compiled models are keyed by the hash of its .xml then its .bin, which no manifest
    gives: the cache says how it names a model (`Cache.model_hash`), else B's would go."""
    folder = tmp_path / "openvino"
    settings = RuntimeSettings(openvino=OpenVINOConfig(cache_dir=folder, cache_max_mb=1))
    store = Store(tmp_path / "state", keep=3, runtimes=settings).ensure()
    m1, m3, m4 = "1" * 64, "3" * 64, "4" * 64
    _four_versions(store, [m1, "", m3, m4])
    ir = store.versions / B
    (ir / "model.xml").write_text("<net/>")
    (ir / "model.bin").write_bytes(b"weights")
    artifact = {"path": "model.xml", "format": "openvino", "sha256": sha256_file(ir / "model.xml")}
    (ir / "manifest.json").write_text(json.dumps({"artifacts": [artifact]}))
    os.utime(ir, (2000, 2000))
    ir_model = sha256_file(ir / "model.xml", ir / "model.bin")
    gone = _compiled(folder, m1, "LATENCY", 100, mtime=50)
    current = _compiled(folder, m4, "LATENCY", 300, mtime=10)
    previous = _compiled(folder, m3, "LATENCY", 300, mtime=20)
    older = _compiled(folder, ir_model, "THROUGHPUT", 300, mtime=30)
    newer = _compiled(folder, ir_model, "LATENCY", 300, mtime=60)

    assert store.gc() == [A]

    expected = {f"{k.digest}{suffix}" for k in (current, previous, newer) for suffix in (".blob", ".json")}
    assert _left(folder) == expected, f"gone: {gone.digest}, older: {older.digest}"
    assert sum(p.stat().st_size for p in folder.iterdir()) <= 1024 * KIB


def test_caches_are_left_alone_when_what_a_version_uses_cannot_be_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "engines"
    settings = RuntimeSettings(tensorrt=TensorRTConfig(engine_cache_dir=folder))
    store = Store(tmp_path / "state", keep=3, runtimes=settings).ensure()
    _four_versions(store, ["1" * 64, "2" * 64, "3" * 64, "4" * 64])
    (store.versions / B / "manifest.json").write_text('{"artifacts": [{"path": "m.onnx"}]}')  # no sha256
    key = _engine(EngineCache(folder), "8" * 64, "fp16", 1, mtime=1)
    assert store.gc() == [A]
    assert EngineCache(folder).lookup(key) is not None
    assert "caches not pruned: cannot tell what the installed versions use" in caplog.text


@pytest.mark.parametrize("state", [State.ACTIVATING, State.PROBATION])
def test_recovery_leaves_an_agent_switch_to_the_deployer_and_the_models_alone(tmp_path: Path, state: State) -> None:
    store = two_versions(tmp_path)
    before = (store.current_sha(), store.previous_sha())
    record = Deployment(id="d1", sha256=C, name="edge-agent", version="0.3.0", kind="agent", from_sha=before[0])
    record = record.to(State.VERIFYING).to(State.INSTALLING).to(State.ACTIVATING)
    store.record(record.to(State.PROBATION) if state == State.PROBATION else record)
    assert store.recover() is None, "the new edge-agent runs: the switch record, not a crash, ends it"
    last = store.last_deployment()
    assert last is not None and (last.state, last.kind) == (state, "agent")
    assert (store.current_sha(), store.previous_sha()) == before
