"""The samples for retraining a device sent (the ``samples`` command's tar, fetched in chunks by
`agent.fleet.client.fetch_chunked`) written into a dataset folder in Ultralytics' layout:
``images/`` (the JPEGs), ``labels/`` (YOLO labels, one ``.txt`` per image), ``meta/`` (each
sample's JSON: camera, time, reason, version, names) and ``data.yaml`` (``path``, ``train`` and
``val``: ``images``, ``names``: the bundle's class names, id -> name). A second fetch into the
same folder adds its samples and writes ``data.yaml`` again.

The archive comes from a device: every member is checked before anything is written (a plain
file, a name ``images|labels|meta/<name>.jpg|txt|json`` with no path in it, at most
`MAX_MEMBER_BYTES`), and the names from the samples' JSON (at most `MAX_NAMES`, each a short
string). Samples of versions whose class names differ cannot share one ``data.yaml``: the newest
sample's names are written and the others reported (`Written.mixed`).
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from runtimes.files import atomic_write

#: a member of the archive: folder, then a file name of the device's sample ids
MEMBER = re.compile(r"(images|labels|meta)/([A-Za-z0-9_.-]{1,120})\.(jpg|txt|json)")
SUFFIX_OF = {"images": "jpg", "labels": "txt", "meta": "json"}
MAX_MEMBER_BYTES = 32 * 1024 * 1024
MAX_NAMES = 10000


class DatasetError(Exception):
    """The archive is not what a device sends: nothing was written."""


@dataclass(frozen=True)
class Written:
    """What `write_dataset` wrote: `samples` images, the `names` in data.yaml, and `mixed`: the
    versions whose samples carry other class names (their labels' ids mean other classes)."""

    samples: int
    names: list[str]
    mixed: tuple[str, ...] = ()


def read_members(archive: bytes) -> dict[str, bytes]:
    """The archive's files by name, all checked (raises `DatasetError`)."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            for member in tar:
                match = MEMBER.fullmatch(member.name)
                if not member.isfile() or match is None or SUFFIX_OF[match.group(1)] != match.group(3):
                    raise DatasetError(f"the archive holds {member.name[:80]!r}, which no device sends")
                if member.size > MAX_MEMBER_BYTES:
                    raise DatasetError(f"{member.name} is {member.size} bytes, over {MAX_MEMBER_BYTES}")
                handle = tar.extractfile(member)
                if handle is None:
                    raise DatasetError(f"{member.name} cannot be read")
                files[member.name] = handle.read(MAX_MEMBER_BYTES + 1)
    except tarfile.TarError as exc:
        raise DatasetError(f"the archive is not a tar: {exc}") from exc
    return files


def _names(meta: bytes, where: str) -> tuple[list[str], str, float]:
    try:
        document = json.loads(meta)
        names, version, time = document["names"], str(document.get("version")), float(document["time"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{where} is not a sample's JSON: {exc}") from exc
    if not isinstance(names, list) or len(names) > MAX_NAMES or not all(isinstance(n, str) for n in names):
        raise DatasetError(f"{where}: names is not a list of at most {MAX_NAMES} strings")
    return [n[:200] for n in names], version, time


def write_dataset(archive: bytes, out: Path) -> Written:
    """Write the samples of `archive` into the dataset folder `out` (made if needed) and its
    ``data.yaml``. Raises `DatasetError` (before writing anything) for an archive no device
    sends."""
    files = read_members(archive)
    metas = {name: _names(data, name) for name, data in files.items() if name.startswith("meta/")}
    for folder in ("images", "labels", "meta"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    for name, data in sorted(files.items()):
        atomic_write(out / name, data)
    # the names of every sample now in the folder (an earlier fetch's too): the newest's win
    found = [_names(path.read_bytes(), f"meta/{path.name}") for path in sorted((out / "meta").glob("*.json"))]
    found = found or list(metas.values())
    names = max(found, key=lambda f: f[2])[0] if found else []
    mixed = tuple(sorted({version for other, version, _ in found if other != names}))
    document = {
        "path": str(out.resolve()),
        "train": "images",
        "val": "images",
        "names": dict(enumerate(names)),
    }
    atomic_write(out / "data.yaml", yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode())
    images = sum(1 for name in files if name.startswith("images/"))
    return Written(images, names, mixed)
