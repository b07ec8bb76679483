"""The TensorRT engine cache: engines on disk, keyed by everything that makes them valid.

An engine runs only on the GPU model and TensorRT version that built it, for the precision and
input profile it was built with. `EngineKey` holds those (ONNX sha256, TensorRT version, GPU
name and compute capability, precision, profile); its `digest` names the files::

    <cache>/<digest>.engine        the serialized engine
    <cache>/<digest>.json          its `EngineRecord`: the key, the model's metadata, build facts
    <cache>/<digest>.failed        why the last build for this key failed (not retried by the
                                   daemon), with the key (JSON; an older agent's: the text alone)
    <cache>/timing-<gpu>-<trt>.cache   TensorRT's timing cache, shared by builds on this GPU
    <cache>/calibration-<sha>.cache    INT8 calibration cache of one ONNX model

A record is written after its engine (both temp + rename), so a crash leaves no record that
names a half-written engine; an entry whose engine fails to deserialize is `discard`ed and built
again. `cache_entries` lists the entries by the model each was made for, so that the bundle
store's gc prunes those of models no installed version has (`runtimes.caches`); timing caches,
shared by every model of a GPU and TensorRT version, are never pruned. Thread safety: one writer
per key (the daemon's engine builder); readers may run at any time.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runtimes.base import CacheEntry, Precision
from runtimes.files import atomic_write


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "unknown"


@dataclass(frozen=True)
class EngineKey:
    """Everything an engine is only valid for. `profile` is (min, opt, max) of the dynamic
    input, or None for a model with fixed shapes."""

    onnx_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: tuple[int, int]
    precision: Precision
    profile: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> EngineKey:
        """Raises `KeyError` / `TypeError` / `ValueError` on a malformed document."""
        profile = raw.get("profile")
        return cls(
            onnx_sha256=str(raw["onnx_sha256"]),
            tensorrt_version=str(raw["tensorrt_version"]),
            gpu_name=str(raw["gpu_name"]),
            compute_capability=(int(raw["compute_capability"][0]), int(raw["compute_capability"][1])),
            precision=_precision(raw["precision"]),
            profile=None if profile is None else (tuple(profile[0]), tuple(profile[1]), tuple(profile[2])),
        )

    @property
    def digest(self) -> str:
        """A file name for this key: the first 32 hex digits of the sha256 of its canonical JSON."""
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    def describe(self) -> str:
        """One line for people: model, precision, GPU and TensorRT version."""
        major, minor = self.compute_capability
        profile = "" if self.profile is None else f", profile {self.profile[0]}..{self.profile[2]}"
        return (
            f"onnx {self.onnx_sha256[:12]} {self.precision} on {self.gpu_name} (sm {major}.{minor}), "
            f"TensorRT {self.tensorrt_version}{profile}"
        )


def _precision(value: Any) -> Precision:
    if value not in ("fp32", "fp16", "int8"):
        raise ValueError(f"precision must be fp32, fp16 or int8, got {value!r}")
    precision: Precision = value
    return precision


@dataclass(frozen=True)
class EngineRecord:
    """What the cache knows about one engine: its key, the model's metadata (the ONNX file's
    metadata properties, so serving does not reopen the ONNX model), the precision it was really
    built with, the INT8 source ("qdq" or "calibration"), how long it took, and where it came
    from ("built" here or "prebuilt" in the bundle)."""

    key: EngineKey
    metadata: dict[str, str] = field(default_factory=dict)
    built_precision: Precision | None = None
    int8_source: str | None = None
    build_seconds: float | None = None
    origin: str = "built"
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["key"] = self.key.to_json()
        return document

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> EngineRecord:
        built = raw.get("built_precision")
        return cls(
            key=EngineKey.from_json(raw["key"]),
            metadata={str(k): str(v) for k, v in dict(raw.get("metadata") or {}).items()},
            built_precision=None if built is None else _precision(built),
            int8_source=raw.get("int8_source"),
            build_seconds=raw.get("build_seconds"),
            origin=str(raw.get("origin", "built")),
            notes=tuple(str(n) for n in raw.get("notes", ())),
        )


class EngineCache:
    """Engines under one folder (default ``<state_dir>/engines``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def engine_path(self, key: EngineKey) -> Path:
        return self.folder / f"{key.digest}.engine"

    def _record_path(self, key: EngineKey) -> Path:
        return self.folder / f"{key.digest}.json"

    def _failure_path(self, key: EngineKey) -> Path:
        return self.folder / f"{key.digest}.failed"

    def timing_cache(self, key: EngineKey) -> Path:
        """The timing cache of this key's GPU and TensorRT version."""
        major, minor = key.compute_capability
        return self.folder / f"timing-{_slug(key.gpu_name)}-sm{major}{minor}-trt{_slug(key.tensorrt_version)}.cache"

    def calibration_cache(self, key: EngineKey) -> Path:
        return self.folder / f"calibration-{key.onnx_sha256[:16]}-trt{_slug(key.tensorrt_version)}.cache"

    def lookup(self, key: EngineKey) -> EngineRecord | None:
        """The record of a cached engine for exactly `key`, or None (absent, or a record that does
        not parse or names another key)."""
        try:
            record = EngineRecord.from_json(json.loads(self._record_path(key).read_bytes()))
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            return None
        if record.key != key or not self.engine_path(key).is_file():
            return None
        return record

    def store(self, record: EngineRecord, engine: bytes) -> Path:
        """Write an engine and then its record; clears a recorded failure. Returns the engine's path."""
        path = self.engine_path(record.key)
        _atomic_write(path, engine)
        _atomic_write(self._record_path(record.key), json.dumps(record.to_json(), indent=2).encode())
        self._failure_path(record.key).unlink(missing_ok=True)
        return path

    def discard(self, key: EngineKey) -> None:
        """Remove a cached engine (it failed to deserialize): the next build replaces it."""
        for path in (self._record_path(key), self.engine_path(key)):
            path.unlink(missing_ok=True)

    def failure(self, key: EngineKey) -> str | None:
        """Why the last build for `key` failed, or None."""
        try:
            text = self._failure_path(key).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        try:
            document = json.loads(text)
        except ValueError:  # an older agent's record: the text alone
            return text or "unknown error"
        if not isinstance(document, dict) or document.get("error") is None:
            return text or "unknown error"
        return str(document["error"]).strip() or "unknown error"

    def record_failure(self, key: EngineKey, message: str) -> None:
        """Record why the build for `key` failed, with the key (what the cache is pruned by)."""
        document = {"key": key.to_json(), "error": message}
        _atomic_write(self._failure_path(key), json.dumps(document, indent=2).encode())


def _model_of(path: Path) -> str | None:
    """The ONNX sha256 of the key in a record or failure file, or None (unreadable, an older
    agent's failure text)."""
    try:
        document = json.loads(path.read_bytes())
        return str(document["key"]["onnx_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


#: an entry's file: its key's digest (32 hex digits), then what it is
_ENTRY = re.compile(r"^([0-9a-f]{32})\.(?:engine|json|failed)$")
#: a calibration cache's name: the first 16 hex digits of its ONNX model's sha256
_CALIBRATION = re.compile(r"^calibration-([0-9a-f]{16})-trt.*\.cache$")


def cache_entries(folder: Path) -> list[CacheEntry]:
    """The entries of the engine cache in `folder` by the model each was made for (what
    `runtimes.caches.prune` removes): an engine with its record and failure, by the record's key;
    a failure alone, by its key; an engine whose record is missing, by none; a calibration cache,
    by its model's sha256's first 16 hex digits. Timing caches are not entries."""
    entries = []
    names = (p.name for p in folder.iterdir())
    digests = sorted({m.group(1) for name in names if (m := _ENTRY.match(name))})
    for digest in digests:
        files = tuple(folder / f"{digest}{suffix}" for suffix in (".engine", ".json", ".failed"))
        record, failure = files[1], files[2]
        model = _model_of(record) if record.is_file() else None
        if model is None and failure.is_file():
            model = _model_of(failure)
        entries.append(CacheEntry(model, tuple(f for f in files if f.exists())))
    for path in sorted(folder.glob("calibration-*.cache")):
        match = _CALIBRATION.match(path.name)
        entries.append(CacheEntry(match.group(1) if match else None, (path,)))
    return entries

    def clear_failure(self, key: EngineKey) -> None:
        self._failure_path(key).unlink(missing_ok=True)
