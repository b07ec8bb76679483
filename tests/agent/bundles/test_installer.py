"""`agent.bundles.installer`: the deployment state machine on one device: bad bundles leave the active
version serving, a full disk, unsigned bundles, switch / rollback / gc, SIGKILL at each step,
probation's end, downgrades."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import DEMO_MODELS, REPO
from testkit.bad_bundles import CASES, without
from testkit.bundles import read_files, write_tar
from testkit.needs import missing
from testkit.store import A, B, C, fake_version, two_versions, walked_to
from testkit.tvm_modules import fake_module

from agent.bundles.archive import Limits, build_bundle
from agent.bundles.installer import InstallPolicy, end_probation, install, rollback
from agent.bundles.record import Deployment, State
from agent.bundles.signing import load_private_key, load_public_key
from agent.bundles.store import Store
from agent.hardware.board import probe
from agent.serving.loader import open_detector
from pipelines.decoding.detector import Detector
from pipelines.sources.synthetic import SyntheticScene
from runtimes.registry import load_runtime


def installed_store(tmp_path: Path, bundle: Path, keys: dict[str, Path]) -> tuple[Store, str]:
    store = Store(tmp_path / "state")
    deployment = install(bundle, store, probe(), InstallPolicy(trusted=[load_public_key(keys["public"])]))
    assert deployment.state == "SUCCEEDED", deployment.error
    return store, deployment.sha256


def assert_serving(store: Store, sha: str) -> None:
    """`current` is `sha`, complete, and its model still detects the synthetic scene's shapes."""
    assert store.current_sha() == sha
    assert not list(store.versions.glob("*.tmp")), "no partial version left behind"
    info = store.info(sha)
    assert info is not None
    manifest = json.loads((info.path / "manifest.json").read_bytes())
    artifact = info.path / manifest["artifacts"][0]["path"]
    runtime = load_runtime("onnxruntime" if artifact.suffix == ".onnx" else "litert", artifact)
    with runtime:
        image, truth = SyntheticScene(seed=42).render(0)
        found = Detector(runtime, manifest["decoder"]).detect(image)
    assert len(found) >= len(truth.detections) - 1 > 0


@pytest.mark.install
@pytest.mark.parametrize("case", list(CASES))
def test_bad_bundles_leave_the_active_version_serving(case: str, tmp_path: Path, keys, bundles) -> None:
    make, state, code, limits = CASES[case]
    store, v1 = installed_store(tmp_path, bundles["v1"], keys)
    bad = make(read_files(bundles["v1"]), keys, tmp_path)
    deployment = install(
        bad, store, probe(), InstallPolicy(trusted=[load_public_key(keys["public"])], limits=limits or Limits())
    )
    assert (deployment.state, deployment.error and deployment.error.code) == (state, code), deployment.error
    assert deployment.error and deployment.error.message
    assert store.last_deployment() is not None and store.last_deployment().state == state  # type: ignore[union-attr]
    assert_serving(store, v1)


@pytest.mark.install
def test_disk_full_during_install(tmp_path: Path, keys, bundles) -> None:
    state = tmp_path / "state"
    state.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1800k", "tmpfs", str(state)], capture_output=True
    ).returncode:
        missing("root", "mounting a small tmpfs needs root")
    try:
        store, v1 = installed_store(tmp_path, bundles["v1"], keys)
        big = tmp_path / "big.bundle"
        build_bundle(
            [DEMO_MODELS / "demo_detector.onnx"],
            big,
            name="demo",
            version="2.0.0",
            key=load_private_key(keys["private"]),
        )
        deployment = install(big, store, probe(), InstallPolicy(trusted=[load_public_key(keys["public"])]))
        assert (deployment.state, deployment.error and deployment.error.code) == ("REJECTED", "DISK_FULL"), (
            deployment.error
        )
        assert_serving(store, v1)
    finally:
        subprocess.run(["umount", str(state)], check=False)


@pytest.mark.install
def test_unsigned_bundle_only_when_allowed(tmp_path: Path, bundles) -> None:
    unsigned = write_tar(tmp_path / "unsigned", without(read_files(bundles["v1"]), "manifest.sig"))
    store = Store(tmp_path / "state")
    refused = install(unsigned, store, probe(), InstallPolicy())
    assert (refused.state, refused.error and refused.error.code) == ("REJECTED", "NO_TRUSTED_KEYS")
    accepted = install(unsigned, store, probe(), InstallPolicy(allow_unsigned=True))
    assert accepted.state == "SUCCEEDED"
    assert_serving(store, accepted.sha256)


@pytest.mark.install
def test_a_compiled_module_is_installed_only_from_a_signed_bundle(tmp_path: Path, keys) -> None:
    """A TVM module is native code: an unsigned bundle (``allow_unsigned``) with one is refused
    (``COMPILED_UNSIGNED``); signed by a trusted key it installs (ONNX Runtime serves its ONNX)."""
    model = DEMO_MODELS / "demo_detector.onnx"
    module = fake_module(model, tmp_path)
    signed, unsigned = tmp_path / "signed.bundle", tmp_path / "unsigned.bundle"
    build_bundle([model], unsigned, name="demo", modules=[module])
    build_bundle([model], signed, name="demo", modules=[module], key=load_private_key(keys["private"]))
    store = Store(tmp_path / "state")
    refused = install(unsigned, store, probe(), InstallPolicy(allow_unsigned=True))
    assert (refused.state, refused.error and refused.error.code) == ("REJECTED", "COMPILED_UNSIGNED")
    assert "demo_detector.so" in str(refused.error and refused.error.message)
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])], allow_unsigned=True)
    accepted = install(signed, store, probe(), policy)
    assert accepted.state == "SUCCEEDED", accepted.error
    assert_serving(store, accepted.sha256)


@pytest.mark.install
def test_an_rknn_model_is_data_an_unsigned_bundle_may_carry_and_another_board_serves_its_onnx(
    tmp_path: Path,
) -> None:
    """An .rknn is data to the NPU's runtime (not native code): an unsigned bundle carries it
    and its record; on this x86 machine selection leaves it out and ONNX Runtime serves."""
    from testkit.rknn_double import double_rknn

    model = DEMO_MODELS / "demo_detector.onnx"
    converted = double_rknn(model, tmp_path)
    bundle = tmp_path / "rock5b.bundle"
    manifest = build_bundle([model], bundle, name="demo", modules=[converted])
    (entry,) = [a for a in manifest.artifacts if a.format == "rknn"]
    assert entry.target is not None and (entry.target.target, entry.target.arch) == ("rk3588", "aarch64")
    assert entry.precision == "int8"
    store = Store(tmp_path / "state")
    done = install(bundle, store, probe(), InstallPolicy(allow_unsigned=True))
    assert done.state == "SUCCEEDED", done.error
    assert_serving(store, done.sha256)


@pytest.mark.install
def test_install_switch_rollback_and_gc(tmp_path: Path, keys, bundles) -> None:
    store, v1 = installed_store(tmp_path, bundles["v1"], keys)
    v2 = install(bundles["v2"], store, probe(), InstallPolicy(trusted=[load_public_key(keys["public"])]))
    assert v2.state == "SUCCEEDED" and [s for s, _ in v2.history] == [
        "VERIFYING",
        "INSTALLING",
        "ACTIVATING",
        "SUCCEEDED",
    ]
    assert (store.current_sha(), store.previous_sha()) == (v2.sha256, v1)
    assert_serving(store, v2.sha256)
    assert store.rollback() == v1
    assert (store.current_sha(), store.previous_sha()) == (v1, v2.sha256)
    assert_serving(store, v1)
    # Reinstalling the previous version reuses its folder.
    again = install(bundles["v2"], store, probe(), InstallPolicy(trusted=[load_public_key(keys["public"])]))
    assert again.state == "SUCCEEDED" and store.current_sha() == v2.sha256
    # An activation collects the garbage: keep_versions (2 here) leaves current and previous only.
    store.keep = 2
    (store.versions / ("f" * 64)).mkdir()
    (store.versions / ("f" * 64) / "manifest.json").write_text('{"name": "old", "version": "0.0.1"}')
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    after = install(bundles["v1"], store, probe(), policy, allow_downgrade=True)
    assert after.state == "SUCCEEDED"
    assert sorted(p.name for p in store.versions.iterdir()) == sorted([v1, v2.sha256]), "the third version was removed"


# where `edge-agent install` is killed -> the state `status` finds after recovering
KILL_STEPS = {
    "verifying": "REJECTED",
    "unpacked": "REJECTED",
    "installing": "REJECTED",
    "installed": "REJECTED",
    "activating": "ROLLED_BACK",  # it may have been the new model that killed the process
    "switched": "SUCCEEDED",
}


@pytest.mark.install
@pytest.mark.parametrize(("step", "recovered"), list(KILL_STEPS.items()))
def test_sigkill_at_each_step_recovers_to_a_complete_version(
    step: str, recovered: str, tmp_path: Path, keys, bundles
) -> None:
    store, v1 = installed_store(tmp_path, bundles["v1"], keys)
    cli = [sys.executable, "-m", "agent.cli"]
    state = ["--state-dir", str(store.root)]
    killed = subprocess.run(
        [*cli, "install", str(bundles["v2"]), *state, "--trust-key", str(keys["public"])],
        cwd=REPO,
        env={**os.environ, "EDGE_AGENT_KILL_AT": step},
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == -9, killed.stderr
    status = subprocess.run([*cli, "status", *state, "--json"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    v2 = hashlib.sha256(bundles["v2"].read_bytes()).hexdigest()
    expected = v2 if step == "switched" else v1
    assert report["current"]["sha256"] == expected
    assert report["deployment"]["state"] == recovered
    if step != "switched":
        assert report["deployment"]["error"]["code"] == "INTERRUPTED"
        assert not (store.versions / v2).exists(), "the unfinished version was removed"
    assert_serving(store, expected)


@pytest.mark.parametrize("state", ["ACTIVATING", "PROBATION"])
def test_a_crash_after_the_switch_of_a_watched_version_rolls_it_back(tmp_path: Path, state: str) -> None:
    store = two_versions(tmp_path)
    fake_version(store, C, 3000)
    deployment = Deployment(id="d", sha256=C, from_sha=B, previous_before=A, probation_s=120, name="x", version="3")
    store.switch(C)
    deployment = walked_to(deployment, State(state))
    store.record(deployment)
    recovered = store.recover()
    assert recovered is not None and recovered.state == "ROLLED_BACK"
    assert recovered.error is not None and recovered.error.code == "PROBATION_FAILED"
    assert (store.current_sha(), store.previous_sha()) == (B, A)
    assert not (store.versions / C).exists(), "the version that crashed the agent is removed"


def test_end_probation_restores_the_pointers_or_keeps_the_version(tmp_path: Path) -> None:
    store = two_versions(tmp_path)
    fake_version(store, C, 3000)
    failing = Deployment(id="d", sha256=C, from_sha=B, previous_before=A, probation_s=1, name="x", version="3.0.0")
    store.switch(C)
    failing = end_probation(store, walked_to(failing, State.PROBATION), "camera cam0 inferred no frame")
    assert failing.state == "ROLLED_BACK" and [s for s, _ in failing.history][-2:] == ["FAILED", "ROLLED_BACK"]
    assert (store.current_sha(), store.previous_sha()) == (B, A) and not (store.versions / C).exists()
    assert store.highest_version("x") is None, "a version that failed probation does not count as installed"


@pytest.mark.install
def test_downgrades_are_refused_unless_asked_for_and_rollback_stays(tmp_path: Path, keys, bundles) -> None:
    store = Store(tmp_path / "state", keep=2)
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    assert install(bundles["v2"], store, probe(), policy).state == "SUCCEEDED"  # demo 1.1.0
    refused = install(bundles["v1"], store, probe(), policy)  # demo 1.0.0
    assert (refused.state, refused.error and refused.error.code) == ("REJECTED", "DOWNGRADE_REFUSED")
    assert refused.error is not None and "1.0.0 is older than 1.1.0" in refused.error.message
    assert store.info(store.current_sha()).version == "1.1.0"  # type: ignore[union-attr]
    accepted = install(bundles["v1"], store, probe(), policy, allow_downgrade=True)
    assert accepted.state == "SUCCEEDED" and store.info(store.current_sha()).version == "1.0.0"  # type: ignore[union-attr]
    assert store.highest_version("demo") == "1.1.0", "going back on purpose does not lower the mark"
    assert rollback(store).state == "ROLLED_BACK" and store.info(store.current_sha()).version == "1.1.0"  # type: ignore[union-attr]
    assert rollback(store).state == "ROLLED_BACK", "rolling back to the lower version is always allowed"


def _hat_bundle(tmp_path: Path, keys: dict[str, Path], nms: bool = False, nms_iou: float = 0.45) -> Path:
    """A signed bundle of the demo detector and a HEF of it for Hailo-8L (the double's, built as
    `bundle build --hef` does: copied, its record written beside it); with `nms`, NMS on the chip
    compiled with IoU `nms_iou` (the bundle's own is the demo detector's 0.45)."""
    from testkit import hailo_double

    from runtimes.hailo_backend import write_record

    model = DEMO_MODELS / "demo_detector.onnx"
    (tmp_path / "hef").mkdir()
    hef = hailo_double.write_hef(tmp_path / "hef" / "demo.hef", model, hw_arch="hailo8l", nms=nms, nms_iou=nms_iou)
    write_record(hef, model)
    bundle = tmp_path / "hat.bundle"
    build_bundle([model], bundle, name="demo", modules=[hef], key=load_private_key(keys["private"]))
    return bundle


@pytest.mark.install
@pytest.mark.parametrize(
    ("nms", "nms_iou", "failure"),
    [
        pytest.param(False, 0.45, None, id="raw"),
        pytest.param(True, 0.45, None, id="nms-on-chip"),
        pytest.param(True, 0.7, "its detections agree", id="nms-on-chip-with-other-thresholds"),
    ],
)
def test_a_hef_bundle_is_served_by_the_ai_hat_s_chip_through_hailort(
    nms: bool,
    nms_iou: float,
    failure: str | None,
    tmp_path: Path,
    keys,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a Pi 5 with the AI HAT+ (the rpi5-hailo8l tree, HailoRT's double in this process and in
    the probe child), activation selects the HEF and checks it through the Hailo backend against
    the ONNX model's reference: raw outputs value by value, NMS on the chip (the ``end2end``
    decoder, whatever the manifest's) by its detections, which an NMS compiled with other
    thresholds fails (``PARITY_FAILED``)."""
    # fails on: the activation probing or loading at this machine's / (no chip: ONNX Runtime
    # serves), the HEF's reference input not what a HEF takes (PARITY_FAILED), the manifest's
    # raw decoder forced on NMS rows (DECODER_MISMATCH), the detections' agreement not gated
    from testkit import FAKES, hailo_double, standin_env

    from runtimes import isolation

    monkeypatch.setattr(isolation, "PROCESS_RUNNER", isolation.ChildRunner(env=standin_env("hailo")))
    bundle = _hat_bundle(tmp_path, keys, nms, nms_iou)
    board = probe(FAKES / "rpi5-hailo8l", arch="aarch64")
    caplog.set_level("INFO", logger="agent.bundles.installer")
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    with hailo_double.installed("hailo8l"):
        done = install(bundle, Store(tmp_path / "state"), board, policy)
    if failure is not None:
        assert done.state == "ROLLED_BACK" and done.error is not None and done.error.code == "PARITY_FAILED"
        assert failure in done.error.message and "demo_detector.onnx" in done.error.message, done.error
        return
    assert done.state == "SUCCEEDED", done.error
    assert "activated demo.hef on hailo (Raspberry Pi aarch64: hailo on Hailo-8/8L is preferred" in caplog.text
    info = Store(tmp_path / "state").info(done.sha256)
    assert info is not None
    with hailo_double.installed("hailo8l"):
        loaded = open_detector(info.path, board)  # what the cameras serve
        try:
            assert (loaded.choice.runtime, loaded.detector.decoder) == ("hailo", "end2end" if nms else "yolov8")
            image, truth = SyntheticScene(seed=42).render(0)
            assert len(loaded.detector.detect(image)) >= len(truth.detections) - 1 > 0
        finally:
            loaded.detector.close()


@pytest.mark.install
def test_a_hef_for_hailo_8l_on_the_ai_hat_2_is_a_target_mismatch_before_activation(
    tmp_path: Path, keys, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On a Pi 5 with the AI HAT+ 2 (Hailo-10H), the Hailo-8L HEF is never loaded: the ONNX model
    serves, its reason naming both chips; with ``runtime: hailo`` the version is refused so."""
    # fails on: the manifest's chip not passed to selection (HailoRT's double would open the HEF)
    from testkit import FAKES, hailo_double, standin_env

    from runtimes import isolation

    env = {**standin_env("hailo"), "EDGE_AGENT_TEST_HAILO_ARCH": "hailo10h"}
    monkeypatch.setattr(isolation, "PROCESS_RUNNER", isolation.ChildRunner(env=env))
    bundle = _hat_bundle(tmp_path, keys)
    board = probe(FAKES / "rpi5-hailo10h", arch="aarch64")
    trusted = [load_public_key(keys["public"])]
    caplog.set_level("INFO", logger="agent.bundles.installer")
    hailo_double.VDevice.opened.clear()
    with hailo_double.installed("hailo10h"):
        served = install(bundle, Store(tmp_path / "a"), board, InstallPolicy(trusted=trusted))
        refused = install(bundle, Store(tmp_path / "b"), board, InstallPolicy(trusted=trusted, preference="hailo"))
    assert served.state == "SUCCEEDED", served.error
    mismatch = "hailo: TARGET_MISMATCH: demo.hef for hailo8l (Hailo-8/Hailo-8L), this board is Hailo-10H aarch64"
    assert "activated demo_detector.onnx on " in caplog.text and mismatch in caplog.text, caplog.text
    assert refused.state == "ROLLED_BACK" and refused.error is not None and refused.error.code == "NO_RUNTIME"
    assert mismatch in refused.error.message, refused.error.message
    assert not hailo_double.VDevice.opened, "HailoRT never opened the chip for the other generation's HEF"
