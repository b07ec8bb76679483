"""Reading, rewriting and re-signing bundle files in tests."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from agent.bundles.archive import build_bundle
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.signing import load_private_key, load_public_key, signature_file
from agent.bundles.store import Store
from agent.hardware.board import Board, probe

Files = dict[str, bytes]


def read_files(bundle: Path) -> Files:
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def write_tar(
    path: Path,
    files: Files,
    extra: Callable[[tarfile.TarFile], None] | None = None,
    gz: bool = False,
    compression: Literal["", "gz", "bz2", "xz"] = "",
) -> Path:
    """A tar of `files` (then what `extra` adds) at `path`; gzip-compressed with `gz`, or as
    `compression` names."""
    with tarfile.open(path, "w:" + (compression or ("gz" if gz else ""))) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra:
            extra(tar)
    return path


def bundle_of(model: Path, out: Path, key: Path, *, name: str = "demo", version: str = "1.0.0") -> Path:
    """A bundle of the one `model` at `out`, signed with the private key at `key`, its reference
    outputs made by running `model` itself, as ``edge-agent bundle build`` makes them."""
    build_bundle([model], out, name=name, version=version, key=load_private_key(key))
    return out


def new_version(bundle: Path, out: Path, key: Path, version: str) -> Path:
    """A good new version: `bundle`'s files (the same network, the same reference outputs) under
    another version number, signed again with the private key at `key`, at `out`. (A good variant
    of the demo detector with other weights is ``agent/demo/demo_detector_int8_qdq.onnx``: its
    precision and recall on the held-out clip are within 0.002 of the FP32 model's,
    agent/demo/README.md.)"""
    return write_tar(out, resign(read_files(bundle), key, edit=lambda manifest: manifest.update(version=version)))


def resign(files: Files, key_path: Path, edit: Callable[[dict], None] | None = None) -> Files:
    """Apply `edit` to the manifest, refresh the hashes of files that changed, sign again."""
    manifest = json.loads(files["manifest.json"])
    if edit:
        edit(manifest)
    for entry in manifest.get("artifacts", []) + manifest.get("files", []):
        if isinstance(entry, dict) and entry.get("path") in files:
            data = files[entry["path"]]
            entry["sha256"], entry["size"] = hashlib.sha256(data).hexdigest(), len(data)
    data = json.dumps(manifest, sort_keys=True, indent=2).encode() + b"\n"
    signature = signature_file(data, load_private_key(key_path))
    return {"manifest.json": data, "manifest.sig": signature, **without_head(files)}


def without_head(files: Files) -> Files:
    """`files` without manifest.json and manifest.sig (a bundle's first two members)."""
    return {k: v for k, v in files.items() if k not in ("manifest.json", "manifest.sig")}


def install_versions(
    state_dir: Path, keys: dict[str, Path], bundles: dict[str, Path], board: Board | None = None
) -> list[Path]:
    """Install the demo bundles v1 (INT8 Q/DQ ONNX) then v2 (INT8 TFLite, current) into the store at
    `state_dir`, so a rollback has somewhere to go; their version folders."""
    store = Store(state_dir)
    policy = InstallPolicy(trusted=[load_public_key(keys["public"])])
    versions = []
    for name in ("v1", "v2"):
        deployment = install(bundles[name], store, board or probe(), policy)
        assert deployment.state == "SUCCEEDED", deployment.error
        versions.append(store.versions / deployment.sha256)
    return versions


def listing(manifest: bytes, extra: Files) -> Files:
    """A bundle's files: `manifest` (a real one's bytes, unsigned) listing `extra` too, then
    `extra`: what `unpack` takes in (it refuses a file the manifest does not list)."""
    document = json.loads(manifest)
    names = {name.removeprefix("./") for name in extra}
    document["files"] = [e for e in document["files"] if e["path"] not in names] + [
        {"path": name.removeprefix("./"), "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        for name, data in extra.items()
    ]
    return {"manifest.json": json.dumps(document).encode(), **extra}
