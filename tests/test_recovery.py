"""The store after crashes and tampering, downgrades, and the probation judge (no broker)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.bundles.install import InstallPolicy, end_probation, install, rollback
from agent.bundles.record import Deployment, State
from agent.bundles.signing import load_public_key
from agent.bundles.store import Store, version_key
from agent.daemon.probation import PASSED, ProbationJudge
from agent.hardware.probe import probe
from pipelines.metrics import Percentiles
from pipelines.pipeline import PipelineStats
from pipelines.sources import SourceState
from tests.test_manifest_store import fake_version

A, B, C = "a" * 64, "b" * 64, "c" * 64


def two_versions(tmp_path: Path) -> Store:
    """A store serving B with A as previous (fake versions: a manifest each)."""
    store = Store(tmp_path / "state").ensure()
    fake_version(store, A, 1000)
    fake_version(store, B, 2000)
    store.switch(A)
    store.switch(B)
    return store


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


@pytest.mark.parametrize("state", ["ACTIVATING", "PROBATION"])
def test_a_crash_after_the_switch_of_a_watched_version_rolls_it_back(tmp_path: Path, state: str) -> None:
    store = two_versions(tmp_path)
    fake_version(store, C, 3000)
    deployment = Deployment(id="d", sha256=C, from_sha=B, previous_before=A, probation_s=120, name="x", version="3")
    store.switch(C)
    deployment.to(State(state))
    store.record(deployment)
    recovered = store.recover()
    assert recovered is not None and recovered.state == "ROLLED_BACK"
    assert recovered.error is not None and recovered.error["code"] == "PROBATION_FAILED"
    assert (store.current_sha(), store.previous_sha()) == (B, A)
    assert not (store.versions / C).exists(), "the version that crashed the agent is removed"


def test_end_probation_restores_the_pointers_or_keeps_the_version(tmp_path: Path) -> None:
    store = two_versions(tmp_path)
    fake_version(store, C, 3000)
    failing = Deployment(id="d", sha256=C, from_sha=B, previous_before=A, probation_s=1, name="x", version="3.0.0")
    store.switch(C)
    failing.to(State.PROBATION)
    end_probation(store, failing, "camera cam0 inferred no frame")
    assert failing.state == "ROLLED_BACK" and [s for s, _ in failing.history][-2:] == ["FAILED", "ROLLED_BACK"]
    assert (store.current_sha(), store.previous_sha()) == (B, A) and not (store.versions / C).exists()
    assert store.highest_version("x") is None, "a version that failed probation does not count as installed"


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


@pytest.mark.install
def test_downgrades_are_refused_unless_asked_for_and_rollback_stays(tmp_path: Path, keys, bundles) -> None:
    store = Store(tmp_path / "state", keep=2)
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    assert install(bundles["v2"], store, probe(), policy).state == "SUCCEEDED"  # demo 1.1.0
    refused = install(bundles["v1"], store, probe(), policy)  # demo 1.0.0
    assert (refused.state, (refused.error or {}).get("code")) == ("REJECTED", "DOWNGRADE_REFUSED")
    assert "1.0.0 is older than 1.1.0" in (refused.error or {})["message"]
    assert store.info(store.current_sha()).version == "1.1.0"  # type: ignore[union-attr]
    accepted = install(bundles["v1"], store, probe(), policy, allow_downgrade=True)
    assert accepted.state == "SUCCEEDED" and store.info(store.current_sha()).version == "1.0.0"  # type: ignore[union-attr]
    assert store.highest_version("demo") == "1.1.0", "going back on purpose does not lower the mark"
    assert rollback(store).state == "ROLLED_BACK" and store.info(store.current_sha()).version == "1.1.0"  # type: ignore[union-attr]
    assert rollback(store).state == "ROLLED_BACK", "rolling back to the lower version is always allowed"


def stats(name: str, frames: int, errors: int = 0, fps: float = 10.0, state: str = "running", paused: bool = False):
    return PipelineStats(
        name=name,
        source="synthetic",
        fps=fps,
        frames=frames,
        dropped=0,
        errors=errors,
        swaps=0,
        paused=paused,
        max_fps=None,
        workers=1,
        latency_ms={"total": Percentiles(1.0, 2.0)},
        source_status=SourceState(state, None, 0),  # type: ignore[arg-type]
        runtime="onnxruntime",
        model="m.onnx",
    )


# (before the swap, observations as (seconds since the swap, stats), expected verdict or words in it)
PROBATION_CASES = {
    "serves as well": ([stats("a", 100)], [(5, [stats("a", 150)]), (10, [stats("a", 200, fps=9.0)])], PASSED),
    "frames keep failing": ([stats("a", 100)], [(2, [stats("a", 100, errors=3)])], "3 frames failed"),
    "no frame at all": ([stats("a", 100)], [(10, [stats("a", 100)])], "inferred no frame"),
    "half the fps": (
        [stats("a", 100, fps=10.0)],
        [(5, [stats("a", 130, fps=4.0)]), (10, [stats("a", 160, fps=4.5)])],
        "4.2 FPS, below 0.5 x the 10.0 FPS",
    ),
    "paused cameras are not compared": (
        [stats("a", 100, fps=10.0)],
        [(6, [stats("a", 120, fps=0.5, paused=True)]), (10, [stats("a", 121, fps=0.5, paused=True)])],
        PASSED,
    ),
    "a camera the new version started": ([], [(5, [stats("b", 40)]), (10, [stats("b", 90)])], PASSED),
    "a lost camera is not the model's fault": (
        [stats("a", 100)],
        [(10, [stats("a", 100, fps=0.0, state="reconnecting")])],
        PASSED,
    ),
}


@pytest.mark.parametrize("case", list(PROBATION_CASES))
def test_probation_judge(case: str) -> None:
    before, observations, expected = PROBATION_CASES[case]
    judge = ProbationJudge(before, start=100.0, duration_s=10, min_fps_ratio=0.5)
    verdicts = [judge.observe(observed, 100.0 + at) for at, observed in observations]
    assert all(v is None for v in verdicts[:-1]), verdicts
    assert verdicts[-1] is not None and expected in verdicts[-1], verdicts


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
# fmt: on


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
    deployment.to(State(state))
    store.record(deployment)
    recovered = store.recover()
    assert recovered is not None and recovered.state == final
    assert (recovered.error or {}).get("code") == code
    assert words is None or (recovered.error or {}).get("message") == words
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
        deployment.to(State.VERIFYING)
        store.record(deployment)
        assert store.recover() is not None
        assert (store.versions / sha).is_dir() and (store.current_sha(), store.previous_sha()) == (B, A)


def test_nothing_to_recover_after_a_final_state(tmp_path: Path) -> None:
    store = two_versions(tmp_path)
    deployment = Deployment(id="d", sha256=B, from_sha=A, name="x", version="2")
    deployment.to(State.SUCCEEDED)
    store.record(deployment)
    assert store.recover() is None and store.last_deployment().state == "SUCCEEDED"  # type: ignore[union-attr]
