"""The runtime probe's answer kept on disk between starts of the agent, under a key of everything
that can change it.

Probing the backends (`runtimes.isolation`) starts a child process that imports every native
library: about half a CPU-second at every start of the daemon, a third of its start. What it
finds changes only when something below changes, so the agent keeps the answer in one JSON file
(``<state_dir>/runtime-probe.json``, or agent.yaml's ``runtime_probe_cache``) and takes it back
at the next start when the key it was written under is the key of now (`probe_key`):

- this Python (``sys.executable``, ``sys.version``), the agent's version and where its code lives;
- for each backend probed, in order, each of its library's top-level modules: where it would be
  imported from (the path's finder, nothing imported), that file's size and mtime, and
  the version of the distribution of that name;
- the runtime plugins installed (their entry points and distributions' versions);
- the environment that decides what a library finds (``PYTHONPATH``, ``LD_LIBRARY_PATH``,
  ``LD_PRELOAD``, ``CUDA_VISIBLE_DEVICES``);
- the device root and what the probes read under it: the names in ``dev/``, ``dev/dri/`` and
  ``dev/accel/``, and ``proc/device-tree/compatible``.

A file that cannot be read, is larger than `MAX_BYTES`, does not parse or holds another key is
ignored and written again after a fresh probe (`read` returns None). A cached answer is a hint
of what loads, never a promise: a load still fails as it would have (`RuntimeUnavailable`,
`RuntimeCrashed`), and then the registry removes the file (`forget`) so that the next start
probes again. A state directory that cannot be written leaves the agent probing at every start,
as before (logged once per start).

Threads: pure functions over the file system; the file is replaced atomically
(`runtimes.files.atomic_write`), so a reader finds the old answer or the new one.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from importlib import machinery, metadata, util
from pathlib import Path
from typing import Any

from runtimes.base import RuntimeInfo, RuntimeName
from runtimes.files import FileTooLarge, atomic_write, read_at_most

log = logging.getLogger(__name__)

#: a cache file larger than this is not read (a probe's answer is a few KB)
MAX_BYTES = 256 * 1024
#: bumped when the file's shape or the key's meaning changes
FORMAT = 1
#: the environment variables that change what a library finds when it is imported
ENVIRONMENT = ("PYTHONPATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "CUDA_VISIBLE_DEVICES")
#: the device folders whose names the key holds, under the probe's root
DEVICE_FOLDERS = ("dev", "dev/dri", "dev/accel")
_COMPATIBLE = "proc/device-tree/compatible"
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


def probe_key(
    names: Sequence[RuntimeName],
    libraries: Mapping[RuntimeName, Sequence[str]],
    root: Path | None,
    version: str,
    group: str,
) -> dict[str, Any]:
    """Everything that can change what probing `names` finds (the module docstring lists it), as
    a JSON-ready mapping; `version` is the agent's, `group` the plugins' entry point group."""
    base = Path("/") if root is None else root
    return {
        "format": FORMAT,
        "agent": [version, _PACKAGE_ROOT],
        "python": [sys.executable, sys.version],
        "backends": [[name, [_module(m) for m in libraries.get(name, (name,))]] for name in names],
        "plugins": sorted(_plugin(point) for point in metadata.entry_points(group=group)),
        "environment": [[name, os.environ.get(name)] for name in ENVIRONMENT],
        "root": str(base),
        "devices": [[folder, _names(base / folder)] for folder in DEVICE_FOLDERS],
        "compatible": _compatible(base / _COMPATIBLE),
    }


def _module(name: str) -> list[Any]:
    """``[module, where it imports from, size, mtime_ns, distribution version]``, None where unknown."""
    try:  # the path's finder, as a fresh child looks (find_spec gives a module imported here its old spec)
        spec = machinery.PathFinder.find_spec(name) or util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    where = None
    if spec is not None:
        where = spec.origin if spec.has_location else None
        if where is None and spec.submodule_search_locations:
            where = next(iter(spec.submodule_search_locations))
    size = mtime = None
    if where is not None:
        try:
            stat = os.stat(where)
            size, mtime = stat.st_size, stat.st_mtime_ns
        except OSError:
            pass
    try:
        version: str | None = metadata.version(name)
    except (metadata.PackageNotFoundError, ValueError):
        version = None
    return [name, where, size, mtime, version]


def _plugin(point: metadata.EntryPoint) -> list[str | None]:
    dist = point.dist
    return [point.name, point.value, dist.name if dist else None, dist.version if dist else None]


def _names(folder: Path) -> list[str] | None:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return None


def _compatible(path: Path) -> str | None:
    try:
        return read_at_most(path, 4096).hex()
    except (OSError, FileTooLarge):
        return None


def read(path: Path, key: Mapping[str, Any]) -> dict[RuntimeName, RuntimeInfo] | None:
    """The answer `path` holds when it was written under `key`, with an entry for each backend
    the key names; None when it is missing, unreadable, too large, malformed or of another key."""
    try:
        data = read_at_most(path, MAX_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, FileTooLarge) as exc:
        log.info("runtime probe cache %s ignored: %s", path, exc)
        return None
    try:
        document = json.loads(data)
        if document["key"] != json.loads(json.dumps(key)):
            log.info("runtime probe cache %s is of another install or device: probing again", path)
            return None
        infos = {info.name: info for info in map(_info, document["infos"])}
        names = [name for name, _ in key["backends"]]
        if sorted(infos) != sorted(names):
            raise ValueError(f"it names {sorted(infos)}, not {sorted(names)}")
        return {name: infos[name] for name in names}
    except (ValueError, TypeError, KeyError) as exc:  # JSONDecodeError is a ValueError
        log.info("runtime probe cache %s ignored (malformed: %s): probing again", path, exc)
        return None


def _info(record: Any) -> RuntimeInfo:
    """A `RuntimeInfo` from its JSON, every field of the right type; raises ValueError."""
    if not isinstance(record, dict):
        raise ValueError("an answer is not an object")
    name, available, devices = record.get("name"), record.get("available"), record.get("devices")
    optional = {field: record.get(field) for field in ("version", "reason", "crashed")}
    if not isinstance(name, str) or not isinstance(available, bool):
        raise ValueError("an answer has no name or availability")
    if not isinstance(devices, list) or not all(isinstance(d, str) for d in devices):
        raise ValueError(f"{name}'s devices are not a list of names")
    if not all(value is None or isinstance(value, str) for value in optional.values()):
        raise ValueError(f"{name}'s version, reason or crash is not text")
    return RuntimeInfo(name=name, available=available, devices=tuple(devices), **optional)


def write(path: Path, key: Mapping[str, Any], infos: Mapping[RuntimeName, RuntimeInfo]) -> None:
    """Keep `infos` under `key` in `path` (atomically); a failure to write is logged, not raised:
    the next start probes again."""
    document = {"key": key, "infos": [asdict(info) for info in infos.values()]}
    try:
        atomic_write(path, json.dumps(document, indent=1).encode())
    except OSError as exc:
        log.warning("runtime probe cache %s not written (%s): the next start probes again", path, exc)


def forget(path: Path, why: str) -> None:
    """Remove the cache at `path` (`why`: the load that failed), so that the next start probes."""
    try:
        path.unlink()
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("runtime probe cache %s could not be removed (%s) after: %s", path, exc, why)
        return
    log.warning("runtime probe cache %s removed, the next start probes again: %s", path, why)
