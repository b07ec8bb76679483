"""Bundles: every bad input and fault ends REJECTED or ROLLED_BACK with its code, `current`
untouched and still serving; kills at each step recover to a complete version; the CLI flow."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.bundles.archive import Limits, build_bundle, read_manifest, read_reference, unpack, verify_unpacked
from agent.bundles.install import InstallPolicy, install
from agent.bundles.signing import key_id, load_private_key, load_public_key, signature_file, verify
from agent.bundles.store import Store
from agent.errors import BundleError
from agent.hardware.probe import probe
from pipelines.detector import Detector
from pipelines.synthetic import SyntheticScene
from runtimes.registry import load_runtime
from tests.bundle_tools import Files, read_files, resign, write_tar
from tests.conftest import DEMO_MODELS, REPO
from tests.needs import missing


def without(files: Files, name: str) -> Files:
    return {k: v for k, v in files.items() if k != name}


def special(kind: bytes, name: str, target: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, target
        tar.addfile(info)

    return add


def pickled_npz() -> bytes:
    out = io.BytesIO()
    np.savez(out, **{"demo_detector_int8_qdq.onnx__input": np.array([{"evil": 1}], dtype=object)}, allow_pickle=True)
    return out.getvalue()


def mystery_model() -> bytes:
    """A valid ONNX model using an operator no runtime implements."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    node = helper.make_node("Mystery", ["images"], ["output0"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "mystery",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 320, 320])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 7, 2100])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    return bytes(model.SerializeToString())


def scaled_reference(files: Files, factor: float) -> bytes:
    with np.load(io.BytesIO(files["reference.npz"])) as npz:
        arrays = {k: (npz[k] * factor if "output" in k else npz[k]) for k in npz.files}
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


MODEL = "demo_detector_int8_qdq.onnx"

# name -> (make(files, keys, tmp) -> bundle path, expected state, expected code, limits)
CASES: dict[str, tuple[Callable[[Files, dict, Path], Path], str, str, Limits | None]] = {
    "missing signature": (
        lambda f, k, t: write_tar(t / "b", without(f, "manifest.sig")),
        "REJECTED",
        "SIGNATURE_MISSING",
        None,
    ),
    "wrong signature": (
        lambda f, k, t: write_tar(
            t / "b",
            {**f, "manifest.sig": json.dumps({**json.loads(f["manifest.sig"]), "signature": "AAAA" * 22}).encode()},
        ),
        "REJECTED",
        "SIGNATURE_INVALID",
        None,
    ),
    "manifest changed after signing": (
        lambda f, k, t: write_tar(t / "b", {**f, "manifest.json": f["manifest.json"].replace(b'"1.0.0"', b'"9.9.9"')}),
        "REJECTED",
        "SIGNATURE_INVALID",
        None,
    ),
    "unknown signer": (lambda f, k, t: write_tar(t / "b", resign(f, k["other"])), "REJECTED", "UNKNOWN_SIGNER", None),
    "artifact hash mismatch": (
        lambda f, k, t: write_tar(t / "b", {**f, MODEL: f[MODEL][:-1] + bytes([f[MODEL][-1] ^ 1])}),
        "REJECTED",
        "ARTIFACT_HASH_MISMATCH",
        None,
    ),
    "truncated tar": (
        lambda f, k, t: (t / "b").write_bytes(write_tar(t / "full", f).read_bytes()[:300_000]) and t / "b",
        "REJECTED",
        "BUNDLE_TRUNCATED",
        None,
    ),
    "not a tar": (lambda f, k, t: (t / "b").write_bytes(os.urandom(5000)) and t / "b", "REJECTED", "NOT_A_TAR", None),
    "manifest not JSON": (
        lambda f, k, t: write_tar(
            t / "b",
            {
                **f,
                "manifest.json": b"{not json",
                "manifest.sig": signature_file(b"{not json", load_private_key(k["private"])),
            },
        ),
        "REJECTED",
        "MANIFEST_NOT_JSON",
        None,
    ),
    "manifest with unknown key": (
        lambda f, k, t: write_tar(t / "b", resign(f, k["private"], lambda m: m.update(evil=1))),
        "REJECTED",
        "MANIFEST_INVALID",
        None,
    ),
    "manifest with wrong type": (
        lambda f, k, t: write_tar(t / "b", resign(f, k["private"], lambda m: m.update(labels="circle"))),
        "REJECTED",
        "MANIFEST_INVALID",
        None,
    ),
    "missing artifact": (lambda f, k, t: write_tar(t / "b", without(f, MODEL)), "REJECTED", "ARTIFACT_MISSING", None),
    "absolute path": (
        lambda f, k, t: write_tar(t / "b", {**f, "/etc/evil.onnx": b"x"}),
        "REJECTED",
        "UNSAFE_PATH",
        None,
    ),
    "dot-dot path": (lambda f, k, t: write_tar(t / "b", {**f, "../evil.onnx": b"x"}), "REJECTED", "UNSAFE_PATH", None),
    "symlink": (
        lambda f, k, t: write_tar(t / "b", f, special(tarfile.SYMTYPE, "labels2.txt", "/etc/passwd")),
        "REJECTED",
        "LINK_ENTRY",
        None,
    ),
    "hard link": (
        lambda f, k, t: write_tar(t / "b", f, special(tarfile.LNKTYPE, "x.onnx", MODEL)),
        "REJECTED",
        "LINK_ENTRY",
        None,
    ),
    "device file": (
        lambda f, k, t: write_tar(t / "b", f, special(tarfile.CHRTYPE, "null.onnx")),
        "REJECTED",
        "SPECIAL_ENTRY",
        None,
    ),
    "duplicate names": (
        lambda f, k, t: write_tar(t / "b", f, lambda tar: tar.addfile(tarfile.TarInfo("labels.txt"), io.BytesIO())),
        "REJECTED",
        "DUPLICATE_ENTRY",
        None,
    ),
    "a script": (
        lambda f, k, t: write_tar(t / "b", {**f, "install.sh": b"#!/bin/sh\nrm -rf /\n"}),
        "REJECTED",
        "UNEXPECTED_FILE",
        None,
    ),
    "too many files": (lambda f, k, t: write_tar(t / "b", f), "REJECTED", "TOO_MANY_FILES", Limits(max_files=3)),
    "too many bytes": (lambda f, k, t: write_tar(t / "b", f), "REJECTED", "TOO_LARGE", Limits(max_bytes=100_000)),
    "gzip bomb": (
        lambda f, k, t: write_tar(t / "b", {**f, "calibration/0000.png": bytes(64 << 20)}, gz=True),
        "REJECTED",
        "TOO_LARGE",
        Limits(max_bytes=8 << 20),
    ),
    "npz that needs pickle": (
        lambda f, k, t: write_tar(t / "b", resign({**f, "reference.npz": pickled_npz()}, k["private"])),
        "REJECTED",
        "REFERENCE_INVALID",
        None,
    ),
    "artifact that is not a model": (
        lambda f, k, t: write_tar(t / "b", resign({**f, MODEL: b"\x00junk" * 1000}, k["private"])),
        "ROLLED_BACK",
        "ARTIFACT_NOT_A_MODEL",
        None,
    ),
    "model no runtime can load": (
        lambda f, k, t: write_tar(t / "b", resign({**f, MODEL: mystery_model()}, k["private"])),
        "ROLLED_BACK",
        "NO_RUNTIME",
        None,
    ),
    "parity failure": (
        lambda f, k, t: write_tar(t / "b", resign({**f, "reference.npz": scaled_reference(f, 3.0)}, k["private"])),
        "ROLLED_BACK",
        "PARITY_FAILED",
        None,
    ),
}


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


#: what the refusal of each case says (beside its code), for the checks run on their own
WORDS = {
    "missing signature": "the bundle is not signed (manifest.sig is missing)",
    "wrong signature": "does not match manifest.json: changed after signing?",
    "manifest changed after signing": "does not match manifest.json: changed after signing?",
    "unknown signer": "which this device does not trust (trusted: ",
    "artifact hash mismatch": f"{MODEL} sha256 ",
    "truncated tar": "",
    "not a tar": "b is not a tar archive",
    "manifest not JSON": "manifest.json is not JSON: ",
    "manifest with unknown key": "manifest.json: evil: ",
    "manifest with wrong type": "manifest.json: labels: ",
    "missing artifact": f"{MODEL} is listed in the manifest but not in the bundle",
    "absolute path": "bundle entry '/etc/evil.onnx' has an absolute path",
    "dot-dot path": "bundle entry '../evil.onnx' points outside the bundle",
    "symlink": "bundle entry 'labels2.txt' is a link",
    "hard link": "bundle entry 'x.onnx' is a link",
    "device file": "bundle entry 'null.onnx'",
    "duplicate names": "bundle entry 'labels.txt' appears twice",
    "a script": "install.sh",
    "too many files": "bundle has more than 3 files",
    "too many bytes": "",
    "gzip bomb": "",
    "npz that needs pickle": "reference.npz cannot be loaded without pickle",
}


@pytest.mark.parametrize("case", [case for case, (_, state, _, _) in CASES.items() if state == "REJECTED"])
def test_unpack_and_verify_refuse_each_bad_bundle_with_its_code(case: str, tmp_path: Path, keys, bundles) -> None:
    """The checks themselves, without an install around them: what `install` runs before it
    touches the store (the install test below shows the store untouched and still serving)."""
    make, _, code, limits = CASES[case]
    bad = make(read_files(bundles["v1"]), keys, tmp_path)
    folder = tmp_path / "unpacked"
    folder.mkdir()
    with pytest.raises(BundleError) as refused:
        unpacked = unpack(bad, folder, limits or Limits())
        verify_unpacked(folder, [load_public_key(keys["public"])], False, unpacked.files)
    assert refused.value.code == code, refused.value
    assert WORDS[case] in str(refused.value), refused.value


@pytest.mark.parametrize(
    ("name", "code", "words"),
    [
        ("model.onnx", None, None),
        ("model.tflite", None, None),
        ("labels.txt", None, None),
        ("calibration/0001.jpg", None, None),
        ("calibration/0002.JPEG", None, None),
        ("calibration/0003.png", None, None),
        ("./model2.onnx", None, None),
        ("calibration/notes.txt", "UNEXPECTED_FILE", "is not a file a bundle may carry"),
        ("calibration/deeper/0001.jpg", "UNEXPECTED_FILE", "is not a file a bundle may carry"),
        ("models/model.onnx", "UNEXPECTED_FILE", "is not a file a bundle may carry"),
        ("run.sh", "UNEXPECTED_FILE", "is not a file a bundle may carry"),
        ("model.ONNX", "UNEXPECTED_FILE", "is not a file a bundle may carry"),
        ("\\evil.onnx", "UNSAFE_PATH", "bundle entry '\\\\evil.onnx' has an absolute path"),
        ("a\\evil.onnx", "UNSAFE_PATH", "bundle entry 'a\\\\evil.onnx' points outside the bundle"),
        (".", "UNSAFE_PATH", "bundle entry '.' has no file name"),
    ],
)
def test_what_a_bundle_may_carry(name: str, code: str | None, words: str | None, tmp_path: Path) -> None:
    """Names one at a time: models, labels, the manifest, the reference, calibration images one
    folder down; nothing else, and no path that leaves the folder."""
    bundle = write_tar(tmp_path / "b.bundle", {name: b"data"})
    folder = tmp_path / "unpacked"
    folder.mkdir()
    if code is None:
        assert list(unpack(bundle, folder, Limits()).files) == [name.removeprefix("./")]
        return
    with pytest.raises(BundleError) as refused:
        unpack(bundle, folder, Limits())
    assert refused.value.code == code and words in str(refused.value), refused.value


def test_unpack_limits_are_inclusive_and_it_hashes_the_bundle_as_it_reads(tmp_path: Path) -> None:
    files = {"a.onnx": b"x" * 600, "b.onnx": b"y" * 400, "labels.txt": b"z"}
    bundle = write_tar(tmp_path / "b.bundle", files)

    def unpacked(limits: Limits, **options: bool) -> object:
        folder = tmp_path / f"u{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        return unpack(bundle, folder, limits, **options)

    whole = unpacked(Limits(max_files=3, max_bytes=1001), fsync=True)
    assert whole.sha256 == hashlib.sha256(bundle.read_bytes()).hexdigest()  # type: ignore[attr-defined]
    assert whole.files == {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}  # type: ignore[attr-defined]
    assert unpacked(Limits(), hash_bundle=False).sha256 is None  # type: ignore[attr-defined]
    for limits, code, words in (
        (Limits(max_files=2), "TOO_MANY_FILES", "bundle has more than 2 files"),
        (Limits(max_bytes=1000), "TOO_LARGE", "bundle unpacks to more than 1000 bytes"),
    ):
        with pytest.raises(BundleError, match=re.escape(words)) as refused:
            unpacked(limits)
        assert refused.value.code == code


def unpacked_v1(tmp_path: Path, files: Files) -> tuple[Path, dict[str, str]]:
    folder = tmp_path / "unpacked"
    folder.mkdir()
    return folder, unpack(write_tar(tmp_path / "b", files), folder, Limits()).files


@pytest.mark.parametrize(
    ("signed", "trusted", "allow_unsigned", "outcome"),
    [
        (True, True, False, "fleet key"),
        (True, True, True, "fleet key"),  # signed and trusted: checked even where unsigned is allowed
        (True, False, True, None),  # signed, no key to check it with, unsigned allowed
        (True, False, False, "NO_TRUSTED_KEYS"),
        (False, True, True, None),
        (False, False, True, None),
        (False, True, False, "SIGNATURE_MISSING"),
        (False, False, False, "NO_TRUSTED_KEYS"),
    ],
)
def test_the_signature_policy(
    signed: bool, trusted: bool, allow_unsigned: bool, outcome: str | None, tmp_path: Path, keys, bundles
) -> None:
    files = read_files(bundles["v1"])
    folder, digests = unpacked_v1(tmp_path, files if signed else without(files, "manifest.sig"))
    public = load_public_key(keys["public"])
    check = lambda: verify_unpacked(folder, [public] if trusted else [], allow_unsigned, digests)  # noqa: E731
    if outcome in ("NO_TRUSTED_KEYS", "SIGNATURE_MISSING"):
        with pytest.raises(BundleError) as refused:
            check()
        assert refused.value.code == outcome
        if outcome == "NO_TRUSTED_KEYS":
            assert "this device trusts no signing key and unsigned bundles are not allowed" in str(refused.value)
    else:
        assert check().signer == (key_id(public) if outcome else None)


def test_a_malformed_signature_file_and_an_empty_trust_list(tmp_path: Path, keys, bundles) -> None:
    files = read_files(bundles["v1"])
    sig = json.loads(files["manifest.sig"])
    public = load_public_key(keys["public"])
    for bad in ("not base64 !", "QUJD*"):  # junk characters are refused, not skipped
        with pytest.raises(BundleError, match=r"manifest\.sig is malformed") as refused:
            verify(files["manifest.json"], json.dumps({**sig, "signature": bad}).encode(), [public])
        assert refused.value.code == "SIGNATURE_INVALID"
    with pytest.raises(BundleError, match=r"which this device does not trust \(trusted: none\)"):
        verify(files["manifest.json"], files["manifest.sig"], [])
    with pytest.raises(BundleError, match=rf"trusted: {key_id(public)}\)"):
        verify(files["manifest.json"], resign(files, keys["other"])["manifest.sig"], [public])


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda folder: (folder / "reference.npz").unlink(), "reference.npz is missing"),
        (
            lambda folder: (folder / "reference.npz").write_bytes(b"junk"),
            "reference.npz cannot be loaded without pickle",
        ),
        (
            lambda folder: (folder / "reference.npz").write_bytes(npz_of(folder, drop="__output0")),
            f"has no reference for {MODEL}",
        ),
        (
            lambda folder: (folder / "reference.npz").write_bytes(npz_of(folder, drop="__input")),
            f"has no reference for {MODEL}",
        ),
    ],
    ids=["missing", "not an npz", "no output", "no input"],
)
def test_the_reference_arrays_each_artifact_needs(change, words: str, tmp_path: Path, keys, bundles) -> None:
    folder, _ = unpacked_v1(tmp_path, read_files(bundles["v1"]))
    manifest = read_manifest(folder)[1]
    assert set(read_reference(folder, manifest)) >= {f"{MODEL}__input", f"{MODEL}__output0"}
    change(folder)
    with pytest.raises(BundleError, match=re.escape(words)) as refused:
        read_reference(folder, manifest)
    assert refused.value.code == "REFERENCE_INVALID"


def npz_of(folder: Path, drop: str) -> bytes:
    with np.load(folder / "reference.npz", allow_pickle=False) as npz:
        kept = {k: npz[k] for k in npz.files if not k.endswith(drop)}
    buffer = io.BytesIO()
    np.savez(buffer, **kept)
    return buffer.getvalue()


def test_verify_uses_the_digests_unpack_made_and_hashes_what_they_lack(tmp_path: Path, keys, bundles) -> None:
    files = read_files(bundles["v1"])
    folder, digests = unpacked_v1(tmp_path, files)
    public = load_public_key(keys["public"])
    with pytest.raises(BundleError, match=re.escape(f"{MODEL} sha256 000000000000... differs from the manifest")):
        verify_unpacked(folder, [public], False, {**digests, MODEL: "0" * 64})
    assert verify_unpacked(folder, [public], False, {}).signer == key_id(public)  # hashed here instead
    (folder / MODEL).write_bytes(b"x" + files[MODEL][1:])  # same size, other bytes
    with pytest.raises(BundleError, match="ARTIFACT_HASH_MISMATCH"):
        verify_unpacked(folder, [public], False, {k: v for k, v in digests.items() if k != MODEL})


@pytest.mark.install
@pytest.mark.parametrize("case", list(CASES))
def test_bad_bundles_leave_the_active_version_serving(case: str, tmp_path: Path, keys, bundles) -> None:
    make, state, code, limits = CASES[case]
    store, v1 = installed_store(tmp_path, bundles["v1"], keys)
    bad = make(read_files(bundles["v1"]), keys, tmp_path)
    deployment = install(
        bad, store, probe(), InstallPolicy(trusted=[load_public_key(keys["public"])], limits=limits or Limits())
    )
    assert (deployment.state, (deployment.error or {}).get("code")) == (state, code), deployment.error
    assert deployment.error and deployment.error["message"]
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
        assert (deployment.state, deployment.error["code"]) == ("REJECTED", "DISK_FULL"), deployment.error  # type: ignore[index]
        assert_serving(store, v1)
    finally:
        subprocess.run(["umount", str(state)], check=False)


@pytest.mark.install
def test_unsigned_bundle_only_when_allowed(tmp_path: Path, bundles) -> None:
    unsigned = write_tar(tmp_path / "unsigned", without(read_files(bundles["v1"]), "manifest.sig"))
    store = Store(tmp_path / "state")
    refused = install(unsigned, store, probe(), InstallPolicy())
    assert (refused.state, refused.error["code"]) == ("REJECTED", "NO_TRUSTED_KEYS")  # type: ignore[index]
    accepted = install(unsigned, store, probe(), InstallPolicy(allow_unsigned=True))
    assert accepted.state == "SUCCEEDED"
    assert_serving(store, accepted.sha256)


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


@pytest.mark.install
def test_cli_end_to_end(tmp_path: Path, capsys) -> None:
    from agent.cli import main

    models = DEMO_MODELS
    state = ["--state-dir", str(tmp_path / "state")]
    assert main(["keygen", "--out", str(tmp_path / "keys")]) == 0
    assert oct((tmp_path / "keys" / "signing.key").stat().st_mode & 0o777) == "0o600"
    trust = ["--trust-key", str(tmp_path / "keys" / "signing.pub")]
    for version, model in (("1.0.0", "demo_detector_int8_qdq.onnx"), ("1.1.0", "demo_detector_fp32.tflite")):
        out = tmp_path / f"demo-{version}.bundle"
        argv = [
            "bundle",
            "build",
            "--model",
            str(models / model),
            "--labels",
            str(models / "labels.txt"),
            "--name",
            "demo",
            "--version",
            version,
            "--key",
            str(tmp_path / "keys" / "signing.key"),
            "-o",
            str(out),
        ]
        assert main(argv) == 0
        assert main(["bundle", "verify", str(out), *trust]) == 0
        assert "signed by key" in capsys.readouterr().out
        assert main(["install", str(out), *state, *trust]) == 0
        assert main(["status", *state, "--json"]) == 0
        report = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert report["current"]["version"] == version and report["deployment"] == {"state": "SUCCEEDED", "error": None}
    assert report["previous"]["version"] == "1.0.0"
    assert main(["bundle", "inspect", str(tmp_path / "demo-1.1.0.bundle")]) == 0
    assert "demo 1.1.0 (detect, decoder yolov8)" in capsys.readouterr().out
    assert main(["rollback", *state]) == 0
    assert main(["status", *state, "--json"]) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (report["current"]["version"], report["previous"]["version"]) == ("1.0.0", "1.1.0")
    assert report["deployment"]["state"] == "ROLLED_BACK"


@pytest.mark.install
def test_cli_errors_are_one_line(tmp_path: Path, capsys, keys, bundles) -> None:
    from agent.cli import main

    state = ["--state-dir", str(tmp_path / "state")]
    assert main(["install", str(bundles["v1"]), *state]) == 1
    assert capsys.readouterr().err.strip() == (
        "edge-agent: error: REJECTED: NO_TRUSTED_KEYS: "
        "this device trusts no signing key and unsigned bundles are not allowed"
    )
    assert main(["bundle", "verify", str(bundles["v1"]), "--trust-key", str(tmp_path / "nokey.pub")]) == 1
    assert "cannot read public key" in capsys.readouterr().err
    assert main(["rollback", *state]) == 1
    assert "no previous version" in capsys.readouterr().err
    config = tmp_path / "agent.yaml"
    config.write_text("state_dir: /tmp/x\ntrust_key: []\n")
    assert main(["status", "--config", str(config)]) == 1
    assert "trust_key: Extra inputs are not permitted" in capsys.readouterr().err
    assert main(["keygen", "--out", str(keys["public"].parent)]) == 1
    assert "already exists" in capsys.readouterr().err


@pytest.mark.install
def test_build_with_calibration_images_and_labels(tmp_path: Path, keys, capsys) -> None:
    import cv2

    from agent.cli import main

    calibration = tmp_path / "calib"
    calibration.mkdir()
    for i in range(3):
        cv2.imwrite(str(calibration / f"frame{i}.png"), SyntheticScene(seed=300 + i).render(0)[0])
    (calibration / "notes.txt").write_text("ignored: not an image")
    out = tmp_path / "calib.bundle"
    argv = [
        "bundle",
        "build",
        "--model",
        str(DEMO_MODELS / "demo_detector.onnx"),
        "--calibration",
        str(calibration),
        "--labels",
        str(DEMO_MODELS / "labels.txt"),
        "--key",
        str(keys["private"]),
        "-o",
        str(out),
    ]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["bundle", "inspect", str(out), "--json"]) == 0
    manifest = json.loads(capsys.readouterr().out)
    assert manifest["calibration"] == {"folder": "calibration", "count": 3}
    assert manifest["labels"] == ["circle", "square", "triangle"]
    assert sorted(f["path"] for f in manifest["files"]) == [
        "calibration/0000.png",
        "calibration/0001.png",
        "calibration/0002.png",
        "labels.txt",
        "reference.npz",
    ]
    assert main(["bundle", "verify", str(out), "--trust-key", str(keys["public"])]) == 0
    assert (
        main(
            [
                "bundle",
                "build",
                "--model",
                str(DEMO_MODELS / "demo_detector.onnx"),
                "--calibration",
                str(tmp_path / "none"),
                "-o",
                str(tmp_path / "x.bundle"),
            ]
        )
        == 1
    )
    assert "calibration folder not found" in capsys.readouterr().err
