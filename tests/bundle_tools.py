"""Reading, rewriting and re-signing bundle files in tests."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

from agent.bundles.signing import load_private_key, signature_file

Files = dict[str, bytes]


def read_files(bundle: Path) -> Files:
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def write_tar(
    path: Path, files: Files, extra: Callable[[tarfile.TarFile], None] | None = None, gz: bool = False
) -> Path:
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra:
            extra(tar)
    return path


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
    return {**files, "manifest.json": data, "manifest.sig": signature_file(data, load_private_key(key_path))}
