"""The bad bundles every bundle check must refuse, each with the code it must be refused with (`CASES`),
and the pieces they are made of."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.bundles.archive import Limits
from agent.bundles.signing import load_private_key, signature_file
from testkit.bundles import Files, resign, write_tar


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
#: a model of zeros: 64 MB that gzip makes about 64 KB
BOMB = 64 << 20


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
    "a 900 KB label": (  # it would go into every event, the page's events and a Prometheus label value
        lambda f, k, t: write_tar(
            t / "b", resign(f, k["private"], lambda m: m["labels"].__setitem__(1, "x" * 900_000))
        ),
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
    "gzip bomb signed by a stranger": (  # refused by its signature before its size: nothing inflated
        lambda f, k, t: write_tar(t / "b", resign({**f, MODEL: bytes(BOMB)}, k["other"]), gz=True),
        "REJECTED",
        "UNKNOWN_SIGNER",
        Limits(max_bytes=BOMB // 2),
    ),
    "gzip bomb signed and listed": (
        lambda f, k, t: write_tar(t / "b", resign({**f, MODEL: bytes(BOMB)}, k["private"]), gz=True),
        "REJECTED",
        "TOO_COMPRESSED",
        None,
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
