"""`agent.bundles.archive`: building, unpacking and verifying bundles; every bad bundle refused by its
code, the limits, the signature policy, the reference arrays, calibration images."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import tracemalloc
from pathlib import Path
from typing import Literal

import cv2
import numpy as np
import pytest
from testkit import DEMO_MODELS
from testkit.bad_bundles import BOMB, CASES, MODEL, without
from testkit.bundles import Files, listing, read_files, resign, write_tar

from agent.bundles.archive import (
    RATIO_FLOOR,
    Limits,
    Trust,
    build_bundle,
    read_bundle_manifest,
    read_manifest,
    read_reference,
    unpack,
    verify_unpacked,
)
from agent.bundles.signing import key_id, load_private_key, load_public_key, verify
from agent.errors import BundleError, ErrorCode
from pipelines.decoding.detector import Detector
from pipelines.sources.synthetic import SyntheticScene
from runtimes.registry import load_runtime

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
    "a 900 KB label": "labels[1] is 900000 characters long, more than 128",
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
    "gzip bomb signed by a stranger": "which this device does not trust",
    "gzip bomb signed and listed": "bytes unpacked per compressed byte (bundle_limits.max_compression_ratio)",
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
        trust = Trust([load_public_key(keys["public"])])  # as `install` unpacks
        unpacked = unpack(bad, folder, limits or Limits(), trust=trust)
        verify_unpacked(folder, trust.keys, False, unpacked.files)
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
def test_what_a_bundle_may_carry(name: str, code: str | None, words: str | None, tmp_path: Path, bundles) -> None:
    """Names one at a time, after a manifest listing them: models, labels, the manifest, the
    reference, calibration images one folder down; nothing else, and no path that leaves the folder."""
    manifest = read_files(bundles["v1"])["manifest.json"]
    bundle = write_tar(
        tmp_path / "b.bundle",
        listing(manifest, {name: b"data"}) if code is None else {"manifest.json": manifest, name: b"data"},
    )
    folder = tmp_path / "unpacked"
    folder.mkdir()
    if code is None:
        assert list(unpack(bundle, folder, Limits()).files) == ["manifest.json", name.removeprefix("./")]
        return
    with pytest.raises(BundleError) as refused:
        unpack(bundle, folder, Limits())
    assert refused.value.code == code and words in str(refused.value), refused.value


def test_unpack_limits_are_inclusive_and_it_hashes_the_bundle_as_it_reads(tmp_path: Path, bundles) -> None:
    files = listing(
        read_files(bundles["v1"])["manifest.json"], {"a.onnx": b"x" * 600, "b.onnx": b"y" * 400, "labels.txt": b"z"}
    )
    bundle = write_tar(tmp_path / "b.bundle", files)
    size = sum(len(data) for data in files.values())

    def unpacked(limits: Limits, **options: bool) -> object:
        folder = tmp_path / f"u{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        return unpack(bundle, folder, limits, **options)

    whole = unpacked(Limits(max_files=4, max_bytes=size), fsync=True)
    assert whole.sha256 == hashlib.sha256(bundle.read_bytes()).hexdigest()  # type: ignore[attr-defined]
    assert whole.files == {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}  # type: ignore[attr-defined]
    assert unpacked(Limits(), hash_bundle=False).sha256 is None  # type: ignore[attr-defined]
    for limits, code, words in (
        (Limits(max_files=3), "TOO_MANY_FILES", "bundle has more than 3 files"),
        (Limits(max_bytes=size - 1), "TOO_LARGE", f"bundle unpacks to more than {size - 1} bytes"),
    ):
        with pytest.raises(BundleError, match=re.escape(words)) as refused:
            unpacked(limits)
        assert refused.value.code == code


@pytest.mark.parametrize("compression", ["gz", "bz2", "xz"])
def test_a_compression_bomb_stops_at_the_ratio_with_what_it_wrote_bounded(
    tmp_path: Path, keys, bundles, compression: Literal["gz", "bz2", "xz"]
) -> None:
    """Signed and listed (so neither the signature nor the sizes stop it): inflating stops at
    ``max_compression_ratio`` times the compressed bytes read, however large the file says it is,
    whichever compression the bundle has. The bz2 and xz cases catch the ratio bound planted for
    gzip only."""
    files = resign({**read_files(bundles["v1"]), MODEL: bytes(BOMB)}, keys["private"])
    bad = write_tar(tmp_path / "bomb.bundle", files, compression=compression)
    folder = tmp_path / "unpacked"
    folder.mkdir()
    limits = Limits(max_compression_ratio=20)
    with pytest.raises(BundleError) as refused:
        unpack(bad, folder, limits)
    assert refused.value.code == "TOO_COMPRESSED", refused.value
    written = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert written <= max(RATIO_FLOOR, limits.max_compression_ratio * bad.stat().st_size) < BOMB
    plain = tmp_path / "plain"
    plain.mkdir()
    assert MODEL in unpack(write_tar(tmp_path / "plain.bundle", files), plain, limits).files, "no ratio uncompressed"


def test_a_huge_tar_header_is_refused_before_tarfile_holds_it(tmp_path: Path, bundles) -> None:
    """tarfile keeps a pax header in memory: one of 32 MB before the manifest is refused after
    at most `HEADER_ROOM` of it was read (memory measured by tracemalloc, not time)."""
    manifest = read_files(bundles["v1"])["manifest.json"]
    bad = tmp_path / "header.bundle"
    with tarfile.open(bad, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size, info.pax_headers = len(manifest), {"comment": "x" * (32 << 20)}
        tar.addfile(info, io.BytesIO(manifest))
    folder = tmp_path / "unpacked"
    folder.mkdir()
    tracemalloc.start()
    try:
        with pytest.raises(BundleError) as refused:
            unpack(bad, folder, Limits())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.code == "TOO_LARGE" and "tar headers take more than" in str(refused.value)
    assert peak < 4 << 20, f"{peak} bytes held while reading the header"


def test_manifest_and_signature_come_first(tmp_path: Path, bundles) -> None:
    files = read_files(bundles["v1"])
    for order, code, words in (
        ({MODEL: files[MODEL], **files}, "MANIFEST_MISSING", f"as its first file (it begins with {MODEL!r})"),
        ({**without(files, "manifest.sig"), "manifest.sig": files["manifest.sig"]}, "UNEXPECTED_FILE", "right after"),
    ):
        folder = tmp_path / f"u{len(list(tmp_path.iterdir()))}"
        folder.mkdir()
        with pytest.raises(BundleError) as refused:
            unpack(write_tar(folder.with_suffix(".bundle"), order), folder, Limits())
        assert refused.value.code == code and words in str(refused.value), refused.value


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


MODEL = "demo_detector_int8_qdq.onnx"


def listed(files: dict[str, bytes], key: Path, name: str, data: bytes) -> dict[str, bytes]:
    """`files` plus `name`, listed (hashed) in the manifest and signed again."""

    def add(manifest: dict) -> None:  # type: ignore[type-arg]
        manifest["files"].append({"path": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)})

    return resign({**files, name: data}, key, add)


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        # the allow-list in unpack alone: the script is listed in the manifest, so only unpack can refuse it
        ("listed script", "UNEXPECTED_FILE", "is not a file a bundle may carry"),
        # the listing check in verify alone: an .onnx is a file a bundle may carry, but this one is not listed
        ("unlisted model", "UNEXPECTED_FILE", "files not listed in the manifest: extra.onnx"),
        ("no manifest", "MANIFEST_MISSING", "no manifest.json"),
        ("artifact of another size", "ARTIFACT_HASH_MISMATCH", "bytes, the manifest says"),
        ("reference without an artifact's arrays", "REFERENCE_INVALID", f"has no reference for {MODEL}"),
    ],
)
def test_each_check_of_a_bundle_refuses_on_its_own(
    case: str, code: str, words: str, tmp_path: Path, keys, bundles
) -> None:
    files = read_files(bundles["v1"])
    made = {
        "listed script": lambda: listed(files, keys["private"], "install.sh", b"#!/bin/sh\nrm -rf /\n"),
        "unlisted model": lambda: {**files, "extra.onnx": files[MODEL]},
        "no manifest": lambda: {k: v for k, v in files.items() if k != "manifest.json"},
        "artifact of another size": lambda: {**files, MODEL: files[MODEL] + b"\x00"},
        "reference without an artifact's arrays": lambda: resign(
            {**files, "reference.npz": reference_without_outputs(files)}, keys["private"]
        ),
    }[case]()
    bundle = write_tar(tmp_path / "b.bundle", made)
    folder = tmp_path / "unpacked"
    folder.mkdir()
    with pytest.raises(BundleError, match=words) as refused:
        unpacked = unpack(bundle, folder, Limits())
        verify_unpacked(folder, [load_public_key(keys["public"])], False, unpacked.files)
    assert refused.value.code == code


def reference_without_outputs(files: dict[str, bytes]) -> bytes:
    with np.load(io.BytesIO(files["reference.npz"]), allow_pickle=False) as npz:
        kept = {k: npz[k] for k in npz.files if not k.endswith("__output0")}
    buffer = io.BytesIO()
    np.savez(buffer, **kept)
    return buffer.getvalue()


@pytest.mark.install
def test_the_first_calibration_image_is_the_parity_input(tmp_path: Path, keys) -> None:
    from testkit import DEMO_MODELS

    calibration = []
    for i, value in enumerate((40, 200)):
        path = tmp_path / f"calib{i}.png"
        cv2.imwrite(str(path), np.full((240, 320, 3), value, np.uint8))
        calibration.append(path)
    bundle = tmp_path / "c.bundle"
    build_bundle(
        [DEMO_MODELS / MODEL], bundle, name="c", calibration=calibration, key=load_private_key(keys["private"])
    )
    folder = tmp_path / "unpacked"
    folder.mkdir()
    unpack(bundle, folder, Limits())
    verified = verify_unpacked(folder, [load_public_key(keys["public"])])
    reference = read_reference(folder, verified.manifest)[f"{MODEL}__input"]
    with load_runtime("onnxruntime", DEMO_MODELS / MODEL) as runtime:
        expected, _ = Detector(runtime).prepare(cv2.imread(str(calibration[0])))
    np.testing.assert_array_equal(reference, expected)


@pytest.mark.install
@pytest.mark.parametrize(
    ("model", "task"), [("demo_segment.onnx", "segment"), ("demo_pose.onnx", "pose"), ("demo_obb.onnx", "obb")]
)
def test_bundle_build_takes_the_task_from_the_model(tmp_path: Path, model: str, task: str) -> None:
    from testkit import DEMO_MODELS

    bundle = tmp_path / "t.bundle"
    build_bundle([DEMO_MODELS / model], bundle, name="t")
    assert read_bundle_manifest(bundle).manifest.task == task


@pytest.mark.install
def test_bundle_build_refuses_a_label_over_the_longest_length(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"labels\[2\] is 900000 characters long, more than 128") as refused:
        build_bundle([DEMO_MODELS / MODEL], tmp_path / "l.bundle", labels=["circle", "square", "x" * 900_000])
    assert refused.value.code is ErrorCode.MANIFEST_INVALID and len(str(refused.value)) < 1000
    assert not (tmp_path / "l.bundle").exists()
