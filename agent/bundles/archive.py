"""Model bundles: build, unpack safely, and verify.

A bundle is a tar file (optionally gzip-compressed) holding ``manifest.json``, ``manifest.sig``
(Ed25519 over the exact manifest bytes), the model artifacts, ``labels.txt``, optional
``calibration/`` images and ``reference.npz`` (per artifact: an input and the raw outputs it gave
when the bundle was built, for the device's parity check). It never carries code but a signed
TVM module; an agent bundle (agent_bundle.py) is this archive with edge-agent's wheels instead.

Unpacking streams the tar once: manifest.json and manifest.sig first, the signature checked
before anything else is decompressed, then only the files the manifest lists with their sizes.
It refuses absolute paths, ``..``, links, devices, duplicate names, unexpected files, and more
files or bytes than the limits; decompression itself is bounded by what the accepted entries
may take and by a compression ratio, so a bomb is stopped before it is inflated, written or
buffered (`unpack`).
"""

from __future__ import annotations

import bz2
import errno
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ValidationError

from agent.bundles.engine_settings import engine_tags
from agent.bundles.manifest import (
    SCHEMA_VERSION,
    Agreement,
    ArtifactEntry,
    Calibration,
    ClassifierStage,
    CompiledTarget,
    DetectionThresholds,
    FileEntry,
    InputSpec,
    Manifest,
    ModelFormat,
    Reference,
    decoder_task,
)
from agent.bundles.signing import signature_file, verify
from agent.errors import BundleError, ErrorCode, validation_problems
from runtimes.base import Precision
from runtimes.engine_cache import EngineKey
from runtimes.files import atomic_writer, sha256_file

if TYPE_CHECKING:
    from pipelines.decoding.detection_filter import ThresholdChoice
    from pipelines.decoding.preprocess import PreprocessConfig

MANIFEST, SIGNATURE, LABELS = "manifest.json", "manifest.sig", "labels.txt"
#: a detector's model files by suffix: the manifest's format, and the runtime `build_bundle` runs them on
FORMATS: Mapping[str, ModelFormat] = {".onnx": "onnx", ".tflite": "tflite", ".xml": "openvino"}
#: the CPU runtime that computes a format's reference outputs (at build) and reference detections
REFERENCE_RUNTIMES: Mapping[ModelFormat, str] = {
    "onnx": "onnxruntime",
    "tflite": "litert",
    "openvino": "openvino",
    "tvm": "tvm",
    "rknn": "rknn",
    "hef": "hailo",
}
#: what a bundle's top level may hold besides its manifest, signature, labels and reference:
#: models, OpenVINO IRs' weights, prebuilt TensorRT engines, RKNN models and HEFs (data to their
#: runtimes), and TVM modules (native code: loaded only from a signed bundle, with
#: ``runtimes.tvm.allow_compiled``), each compiled artifact with its record (``.json``)
MODEL_FILE_SUFFIXES = (*FORMATS, ".bin", ".engine", ".so", ".rknn", ".hef")
#: a TVM module's record, beside it (``model.so.json``)
TVM_RECORD_SUFFIX = ".so.json"
#: an RKNN model's record, beside it (``model.rknn.json``); the model is data to the NPU's runtime
RKNN_RECORD_SUFFIX = ".rknn.json"
#: a HEF's record, beside it (``model.hef.json``, written by ``bundle build --hef``)
HEF_RECORD_SUFFIX = ".hef.json"
_CHUNK = 1 << 20
_M = TypeVar("_M", bound=BaseModel)


@dataclass(frozen=True)
class Limits:
    """What a device accepts from one bundle."""

    max_files: int = 256
    max_bytes: int = 1 << 30  # unpacked, all files together
    max_compression_ratio: float = 100.0  # unpacked bytes per compressed byte (gzip, bz2, xz bundles)


@dataclass(frozen=True)
class Trust:
    """Whose signature `unpack` requires over the manifest before it inflates anything else."""

    keys: Sequence[Ed25519PublicKey] = ()
    allow_unsigned: bool = False


@dataclass(frozen=True)
class Verified:
    """An unpacked bundle whose manifest, signature and hashes checked out."""

    folder: Path
    manifest: Manifest
    signer: str | None  # key id, or None for an unsigned bundle the config allows
    reference: dict[str, npt.NDArray[Any]]  # reference.npz, loaded while checking it (`read_reference`)


@dataclass(frozen=True)
class Unpacked:
    """What `unpack` wrote: each file's sha256 (hashed as it was written) and the bundle's."""

    files: dict[str, str]
    sha256: str | None  # None when unpack was told the caller hashed the bundle already


@dataclass(frozen=True)
class BundleHead:
    """The first members of a bundle file (`read_bundle_manifest`): the manifest's exact bytes,
    the manifest, and manifest.sig's bytes (None when unsigned)."""

    data: bytes
    manifest: Manifest
    signature: bytes | None


#: largest manifest.json and manifest.sig a bundle may carry
MAX_MANIFEST_BYTES, MAX_SIGNATURE_BYTES = 1 << 20, 64 << 10
#: room for one member's tar headers (its 512-byte header, a pax or GNU long-name header): more is
#: refused before tarfile reads it, since tarfile holds those headers in memory
HEADER_ROOM = 64 << 10
#: inflated bytes always allowed, whatever the ratio (a small bundle compresses well)
RATIO_FLOOR = 1 << 20
_TAR_BUFSIZE = 64 << 10
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz"}


class _RawReader(io.RawIOBase):
    """The bundle file as read: counts (and, with `hashing`, hashes) every byte read through it."""

    def __init__(self, raw: io.BufferedReader, hashing: bool) -> None:
        self._raw, self.digest = raw, hashlib.sha256() if hashing else None
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._raw.readinto(buffer)
        self.count += count
        if self.digest is not None:
            self.digest.update(memoryview(buffer)[:count])
        return count

    def drain(self) -> str | None:
        """Hash what the tar reader left unread (end-of-archive padding); the file's sha256."""
        if self.digest is None:
            return None
        while block := self._raw.read(_CHUNK):
            self.digest.update(block)
        return self.digest.hexdigest()


class _Inflated(io.RawIOBase):
    """The tar stream inside the bundle file, decompressed here (gzip, bz2, xz, or none) so that
    every byte it produces is bounded before tarfile buffers or writes it: by `allowance` (what
    the members accepted so far may take, raised by `unpack` as it accepts each one) and, for a
    compressed bundle, by `ratio` times the compressed bytes read."""

    def __init__(self, raw: io.BufferedReader, source: _RawReader, name: str, ratio: float) -> None:
        head = raw.peek(6)[:6]
        self.kind = next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)), None)
        self._source, self._name, self._ratio = source, name, ratio
        self._stream: io.RawIOBase | io.BufferedIOBase = source
        if self.kind == "gzip":
            self._stream = gzip.GzipFile(fileobj=source, mode="rb")
        elif self.kind == "bz2":
            self._stream = bz2.BZ2File(source)
        elif self.kind == "xz":
            self._stream = lzma.LZMAFile(cast(IO[bytes], source))  # noqa: SIM115 (closed with the file)
        self.produced = 0
        self.allowance = _TAR_BUFSIZE + HEADER_ROOM  # tarfile's read-ahead and the first header

    def readable(self) -> bool:
        return True

    def allow(self, size: int) -> None:
        """Let a member of `size` bytes through, with its padding and the next member's headers."""
        self.allowance += -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE + HEADER_ROOM

    def readinto(self, buffer: Any) -> int:
        count = self._stream.readinto(buffer)
        self.produced += count
        if self.produced > self.allowance:
            raise BundleError(
                ErrorCode.TOO_LARGE,
                f"{self._name}: its tar headers take more than {HEADER_ROOM} bytes for one file; "
                "not a bundle edge-agent built",
            )
        if self.kind is not None and self.produced > max(RATIO_FLOOR, self._ratio * self._source.count):
            raise BundleError(
                ErrorCode.TOO_COMPRESSED,
                f"{self._name}: more than {self._ratio:g} bytes unpacked per compressed byte "
                "(bundle_limits.max_compression_ratio): a compression bomb?",
            )
        return count


def _member_path(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if path.is_absolute() or name.startswith(("/", "\\")):
        raise BundleError(ErrorCode.UNSAFE_PATH, f"bundle entry {name!r} has an absolute path")
    if ".." in path.parts or "\\" in name:
        raise BundleError(ErrorCode.UNSAFE_PATH, f"bundle entry {name!r} points outside the bundle")
    parts = [p for p in path.parts if p != "."]
    if not parts:
        raise BundleError(ErrorCode.UNSAFE_PATH, f"bundle entry {name!r} has no file name")
    return PurePosixPath(*parts)


def model_member(path: PurePosixPath) -> bool:
    """Only data files a bundle may carry, and TVM modules: nothing else the device would execute.
    (An RKNN model and a HEF are data to their NPU's runtime. A TensorRT engine is data to
    TensorRT's runtime, which refuses engines with embedded host code unless told otherwise;
    edge-agent never tells it. A TVM module is native code: the
    installer takes it only from a signed bundle, the TVM backend loads it only where agent.yaml
    allows it.)"""
    if len(path.parts) == 2 and path.parts[0] == "calibration":
        return path.suffix.lower() in (".jpg", ".jpeg", ".png")
    if len(path.parts) != 1:
        return False
    return (
        path.name in (MANIFEST, SIGNATURE, LABELS, "reference.npz")
        or path.suffix in MODEL_FILE_SUFFIXES
        or path.name.endswith((TVM_RECORD_SUFFIX, RKNN_RECORD_SUFFIX, HEF_RECORD_SUFFIX))
    )


def _next_file(
    tar: tarfile.TarFile,
    seen: Mapping[str, str],
    limits: Limits,
    allowed: Callable[[PurePosixPath], bool] = model_member,
) -> tuple[tarfile.TarInfo, str] | None:
    """The next regular file of `tar` and its name in the bundle (folders are skipped), checked
    for what a bundle of its kind may carry (`allowed`); None at the end."""
    while (member := tar.next()) is not None:
        path = _member_path(member.name)
        if member.issym() or member.islnk():
            raise BundleError(ErrorCode.LINK_ENTRY, f"bundle entry {member.name!r} is a link")
        if member.isdir():
            continue
        if not member.isfile():
            raise BundleError(
                ErrorCode.SPECIAL_ENTRY, f"bundle entry {member.name!r} is a device, fifo or other special file"
            )
        if str(path) in seen:
            raise BundleError(ErrorCode.DUPLICATE_ENTRY, f"bundle entry {member.name!r} appears twice")
        if not allowed(path):
            raise BundleError(
                ErrorCode.UNEXPECTED_FILE, f"bundle entry {member.name!r} is not a file a bundle may carry"
            )
        if len(seen) >= limits.max_files:
            raise BundleError(ErrorCode.TOO_MANY_FILES, f"bundle has more than {limits.max_files} files")
        return member, str(path)
    return None


def check_signature(data: bytes, signature: bytes | None, trust: Trust) -> str | None:
    """The signer's key id of the manifest bytes `data`, or None for an unsigned bundle `trust`
    allows (or a signed one where it trusts no key but allows unsigned). Raises `BundleError`
    ``NO_TRUSTED_KEYS``, ``SIGNATURE_MISSING``, ``UNKNOWN_SIGNER``, ``SIGNATURE_INVALID``."""
    if trust.allow_unsigned and (signature is None or not trust.keys):
        return None
    if not trust.keys:
        raise BundleError(
            ErrorCode.NO_TRUSTED_KEYS, "this device trusts no signing key and unsigned bundles are not allowed"
        )
    return verify(data, signature, trust.keys)


class _Bundle:
    """One pass over a bundle file: its head (manifest, signature) first, then the other files."""

    def __init__(
        self, limits: Limits, tar: tarfile.TarFile, inflated: _Inflated, allowed: Callable[[PurePosixPath], bool]
    ) -> None:
        self.limits, self.tar, self.inflated, self.allowed = limits, tar, inflated, allowed
        self.seen: dict[str, str] = {}  # name -> sha256 of each file read
        self.manifest_data: bytes | None = None  # manifest.json's bytes once read

    def _next(self) -> tuple[tarfile.TarInfo, str] | None:
        return _next_file(self.tar, self.seen, self.limits, self.allowed)

    def head(self, trust: Trust | None) -> tuple[BundleHead, tuple[tarfile.TarInfo, str] | None]:
        """Read manifest.json (the first file) and manifest.sig (right after it, if signed),
        check the signature with `trust` (None: not here), then parse the manifest. Returns the
        head and the next file's header."""
        try:
            data, signature, after = self.raw_head(trust)
        except BundleError as exc:  # a wheel where a model file belongs: say it is an agent bundle
            if exc.code == ErrorCode.UNEXPECTED_FILE and self.manifest_data is not None:
                _refuse_agent_manifest(manifest_json(self.manifest_data))
            raise
        return BundleHead(data, parse_manifest(data), signature), after

    def raw_head(self, trust: Trust | None) -> tuple[bytes, bytes | None, tuple[tarfile.TarInfo, str] | None]:
        """manifest.json's and manifest.sig's bytes, the signature checked with `trust` (None:
        not here), and the next file's header: `head` before the manifest is parsed."""
        first = self._next()
        if first is None or first[1] != MANIFEST:
            raise BundleError(
                ErrorCode.MANIFEST_MISSING,
                "the bundle has no manifest.json"
                + (f" as its first file (it begins with {first[1]!r})" if first else "")
                + "; build bundles with edge-agent bundle build",
            )
        data = self.manifest_data = self._small(first, MAX_MANIFEST_BYTES)
        signature, after = None, self._next()
        if after is not None and after[1] == SIGNATURE:
            signature, after = self._small(after, MAX_SIGNATURE_BYTES), self._next()
        if trust is not None:
            check_signature(data, signature, trust)
        return data, signature, after

    def _small(self, member: tuple[tarfile.TarInfo, str], most: int) -> bytes:
        info, name = member
        if info.size > most:
            raise BundleError(ErrorCode.TOO_LARGE, f"{name} has {info.size} bytes; at most {most} are allowed")
        self.inflated.allow(info.size)
        source = self.tar.extractfile(info)
        assert source is not None  # a regular file always has content
        data = source.read()
        self.seen[name] = hashlib.sha256(data).hexdigest()
        return data

    def extract(
        self, head: BundleHead, member: tuple[tarfile.TarInfo, str] | None, dest: Path, fsync: bool
    ) -> dict[str, str]:
        """Write head's files and every other file (from `member` on) into `dest`; each must be
        listed in the manifest with its size, within the limits, before a byte of it is read."""
        entries: list[ArtifactEntry | FileEntry] = [*all_artifacts(head.manifest), *head.manifest.files]
        return self.extract_listed(head.data, head.signature, {e.path: e.size for e in entries}, member, dest, fsync)

    def extract_listed(
        self,
        data: bytes,
        signature: bytes | None,
        sizes: Mapping[str, int],
        member: tuple[tarfile.TarInfo, str] | None,
        dest: Path,
        fsync: bool,
    ) -> dict[str, str]:
        """`extract` for any kind of bundle: `sizes` are the files its manifest lists."""
        _write(dest / MANIFEST, [data], fsync)
        if signature is not None:
            _write(dest / SIGNATURE, [signature], fsync)
        total = len(data) + len(signature or b"")
        while member is not None:
            info, name = member
            if name == SIGNATURE:
                raise BundleError(ErrorCode.UNEXPECTED_FILE, "manifest.sig must come right after manifest.json")
            total += info.size
            if total > self.limits.max_bytes:
                raise BundleError(ErrorCode.TOO_LARGE, f"bundle unpacks to more than {self.limits.max_bytes} bytes")
            if name not in sizes:
                raise BundleError(ErrorCode.UNEXPECTED_FILE, f"files not listed in the manifest: {name}")
            if info.size != sizes[name]:
                raise BundleError(
                    ErrorCode.ARTIFACT_HASH_MISMATCH, f"{name} has {info.size} bytes, the manifest says {sizes[name]}"
                )
            self.inflated.allow(info.size)
            source = self.tar.extractfile(info)
            assert source is not None  # a regular file always has content
            self.seen[name] = _write(dest / name, iter(partial(source.read, _CHUNK), b""), fsync)
            member = self._next()
        return dict(self.seen)


def _write(target: Path, chunks: Iterable[bytes], fsync: bool) -> str:
    """Write `chunks` to the new file `target`; its sha256."""
    digest = hashlib.sha256()
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("xb") as out:
        for chunk in chunks:
            out.write(chunk)
            digest.update(chunk)
        if fsync:
            out.flush()
            os.fsync(out.fileno())
    return digest.hexdigest()


@contextmanager
def opened_bundle(
    bundle: Path, limits: Limits, hash_bundle: bool, allowed: Callable[[PurePosixPath], bool] = model_member
) -> Iterator[tuple[_Bundle, _RawReader]]:
    """`bundle` open for one pass (its members checked by `allowed`: a model bundle's files by
    default), its errors as `BundleError` codes."""
    seen: dict[str, str] = {}
    try:
        with bundle.open("rb") as raw:
            source = _RawReader(raw, hash_bundle)
            inflated = _Inflated(raw, source, bundle.name, limits.max_compression_ratio)
            with tarfile.open(fileobj=inflated, mode="r|", bufsize=_TAR_BUFSIZE) as tar:
                opened = _Bundle(limits, tar, inflated, allowed)
                seen = opened.seen
                yield opened, source
    except BundleError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise BundleError(ErrorCode.DISK_FULL, f"no space left while unpacking {bundle.name}") from exc
        if isinstance(exc, tarfile.ReadError) or "not a gzip" in str(exc).lower():
            raise BundleError(ErrorCode.NOT_A_TAR, f"{bundle.name} is not a tar archive ({exc})") from exc
        raise BundleError(ErrorCode.UNPACK_FAILED, f"cannot unpack {bundle.name}: {exc}") from exc
    except (zlib.error, lzma.LZMAError) as exc:
        raise BundleError(ErrorCode.BUNDLE_TRUNCATED, f"{bundle.name}: compressed data is corrupt ({exc})") from exc
    except (tarfile.ReadError, tarfile.StreamError, EOFError) as exc:
        if not seen and not isinstance(exc, EOFError) and "unexpected end" not in str(exc).lower():
            raise BundleError(ErrorCode.NOT_A_TAR, f"{bundle.name} is not a tar archive ({exc})") from exc
        raise BundleError(
            ErrorCode.BUNDLE_TRUNCATED, f"{bundle.name} ends early: incomplete download? ({exc})"
        ) from exc
    except tarfile.TarError as exc:
        raise BundleError(ErrorCode.NOT_A_TAR, f"{bundle.name} is not a valid tar archive ({exc})") from exc


def unpack(
    bundle: Path,
    dest: Path,
    limits: Limits,
    fsync: bool = False,
    hash_bundle: bool = True,
    trust: Trust | None = None,
) -> Unpacked:
    """Extract `bundle` into the empty folder `dest`, enforcing `limits`, hashing the files (and,
    with `hash_bundle`, the bundle itself) as it goes, so the bundle is read once.

    manifest.json must be the first file and manifest.sig (when signed) the second: with `trust`
    the signature is checked over the manifest before anything else is inflated. Every other
    file must be listed in the manifest with its size, checked against the limits from its tar
    header before a byte of it is read; what decompression produces is bounded by those sizes
    (tar headers included) and by ``limits.max_compression_ratio``, so neither a compression
    bomb nor a huge tar header is inflated, written or held in memory.

    Raises `BundleError` (``NOT_A_TAR``, ``BUNDLE_TRUNCATED``, ``UNSAFE_PATH``, ``LINK_ENTRY``,
    ``SPECIAL_ENTRY``, ``DUPLICATE_ENTRY``, ``UNEXPECTED_FILE``, ``TOO_MANY_FILES``,
    ``TOO_LARGE``, ``TOO_COMPRESSED``, ``MANIFEST_MISSING``, ``MANIFEST_NOT_JSON``,
    ``MANIFEST_INVALID``, ``ARTIFACT_HASH_MISMATCH`` (a size), the signature's codes (with
    `trust`), ``DISK_FULL``); `dest` may then hold a partial extraction.
    """
    with opened_bundle(bundle, limits, hash_bundle) as (opened, source):
        head, member = opened.head(trust)
        files = opened.extract(head, member, dest, fsync)
        sha256 = source.drain()
    return Unpacked(files, sha256)


def read_bundle_manifest(bundle: Path) -> BundleHead:
    """The manifest (and signature, unchecked) of a bundle file, read without inflating the
    rest: what ``fleet push`` and ``bundle inspect`` need. Raises `BundleError` as `unpack` does."""
    with opened_bundle(bundle, Limits(), hash_bundle=False) as (opened, _):
        head, _ = opened.head(None)
    return head


def parse_manifest(data: bytes) -> Manifest:
    """manifest.json's bytes as a `Manifest`; `BundleError` ``MANIFEST_NOT_JSON`` or ``MANIFEST_INVALID``."""
    raw = manifest_json(data)
    _refuse_agent_manifest(raw)
    return validated(Manifest, raw)


def validated(model: type[_M], raw: Any) -> _M:
    """The manifest `raw` (JSON) as `model`; `BundleError` ``MANIFEST_INVALID`` naming the problems."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc)[:5])
        raise BundleError(ErrorCode.MANIFEST_INVALID, f"manifest.json: {problems}") from exc


def _refuse_agent_manifest(raw: Any) -> None:
    """`BundleError` ``WRONG_BUNDLE_KIND`` when the manifest `raw` is an agent bundle's."""
    if isinstance(raw, dict) and raw.get("kind") == "agent":
        raise BundleError(
            ErrorCode.WRONG_BUNDLE_KIND,
            f"this is an agent bundle (edge-agent {str(raw.get('version'))[:40]}), not a model bundle: "
            "push it with `edge-agent fleet push --agent`",
        )


def manifest_json(data: bytes) -> Any:
    """manifest.json's bytes as JSON; `BundleError` ``MANIFEST_NOT_JSON``."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleError(ErrorCode.MANIFEST_NOT_JSON, f"manifest.json is not JSON: {exc}") from exc


def read_manifest(folder: Path) -> tuple[bytes, Manifest]:
    path = folder / MANIFEST
    if not path.is_file():
        raise BundleError(ErrorCode.MANIFEST_MISSING, "the bundle has no manifest.json")
    data = path.read_bytes()
    return data, parse_manifest(data)


def all_artifacts(manifest: Manifest) -> list[ArtifactEntry]:
    """The detector's artifacts, then the second stage's classifier's (when the bundle has one)."""
    stage = manifest.classifier.artifacts if manifest.classifier is not None else []
    return [*manifest.artifacts, *stage]


def read_reference(folder: Path, manifest: Manifest) -> dict[str, npt.NDArray[Any]]:
    """The reference arrays, loaded without pickle; each artifact needs ``<path>__input``."""
    path = folder / manifest.reference.path
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {key: npz[key] for key in npz.files}
    except FileNotFoundError as exc:
        raise BundleError(ErrorCode.REFERENCE_INVALID, f"{manifest.reference.path} is missing") from exc
    except (ValueError, OSError, EOFError) as exc:
        raise BundleError(
            ErrorCode.REFERENCE_INVALID, f"{manifest.reference.path} cannot be loaded without pickle: {exc}"
        ) from exc
    for artifact in all_artifacts(manifest):
        if f"{artifact.path}__input" not in arrays or f"{artifact.path}__output0" not in arrays:
            raise BundleError(
                ErrorCode.REFERENCE_INVALID, f"{manifest.reference.path} has no reference for {artifact.path}"
            )
    return arrays


def verify_unpacked(
    folder: Path,
    trusted: Sequence[Ed25519PublicKey],
    allow_unsigned: bool = False,
    digests: Mapping[str, str] | None = None,
) -> Verified:
    """Check the manifest, its signature, every artifact's size and hash, and the reference.
    `digests` (from `unpack`) saves hashing the files again."""
    data, manifest = read_manifest(folder)
    sig_path = folder / SIGNATURE
    signature = sig_path.read_bytes() if sig_path.is_file() else None
    signer = check_signature(data, signature, Trust(trusted, allow_unsigned))
    listed = {MANIFEST, SIGNATURE}
    entries: list[ArtifactEntry | FileEntry] = [*all_artifacts(manifest), *manifest.files]
    for entry in entries:
        listed.add(entry.path)
        path = folder / entry.path
        if not path.is_file():
            raise BundleError(
                ErrorCode.ARTIFACT_MISSING, f"{entry.path} is listed in the manifest but not in the bundle"
            )
        size = path.stat().st_size
        if size != entry.size:
            raise BundleError(
                ErrorCode.ARTIFACT_HASH_MISMATCH, f"{entry.path} has {size} bytes, the manifest says {entry.size}"
            )
        digest = digests[entry.path] if digests and entry.path in digests else sha256_file(path)
        if digest != entry.sha256:
            raise BundleError(
                ErrorCode.ARTIFACT_HASH_MISMATCH,
                f"{entry.path} sha256 {digest[:12]}... differs from the manifest's {entry.sha256[:12]}...",
            )
    unlisted = sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and str(p.relative_to(folder)) not in listed
    )
    if unlisted:
        raise BundleError(ErrorCode.UNEXPECTED_FILE, f"files not listed in the manifest: {', '.join(unlisted[:5])}")
    return Verified(folder, manifest, signer, read_reference(folder, manifest))


# -- building ---------------------------------------------------------------------------------


def _precision(path: Path, runtime: Any) -> Precision:
    """int8 when the model holds quantized tensors or ops, else fp16/fp32 by its input type."""
    if path.suffix in (".onnx", ".xml"):
        data = path.read_bytes()
        quantized = (b"QuantizeLinear", b"ConvInteger", b"MatMulInteger", b"QLinearConv", b'type="FakeQuantize"')
        if any(op in data for op in quantized):
            return "int8"
    elif getattr(runtime, "quantized", False):
        return "int8"
    return "fp16" if any(spec.dtype == np.float16 for spec in runtime.inputs) else "fp32"


def reference_frame(calibration: Sequence[Path]) -> npt.NDArray[Any]:
    """The frame a bundle's reference inputs are made from: its first readable calibration image,
    else the synthetic scene's first frame (seed 0; BGR uint8)."""
    import cv2

    for path in calibration:
        image = cv2.imread(str(path), cv2.IMREAD_COLOR)
        if image is not None:
            return np.asarray(image)
    from pipelines.sources.synthetic import SyntheticScene

    return SyntheticScene(seed=0).render(0)[0]


@dataclass(frozen=True)
class ArtifactNotes:
    """What the build learned about one artifact beyond its file (`agent.optimise`): its precision
    where the file's inputs do not show it (an FP16 model keeps FP32 inputs) and its measured
    agreement with the FP32 model."""

    precision: Precision | None = None
    agreement: Agreement | None = None


@dataclass(frozen=True)
class ClassifierInput:
    """What `bundle build --classifier ...` asks for: the classifier's model files (`models`,
    ``.onnx`` / ``.tflite``, one per format or precision), its class `labels` (index = class id),
    the detector labels it applies to (`for_labels`, empty: all) and `every_s` (seconds)."""

    models: Sequence[Path]
    labels: Sequence[str]
    for_labels: Sequence[str] = ()
    every_s: float = 5.0


def _classifier_entries(
    stage: ClassifierInput, frame: npt.NDArray[Any], reference: dict[str, npt.NDArray[Any]]
) -> ClassifierStage:
    """The second stage's manifest section; each model is loaded, checked to be a classifier with
    one score per label, and its reference input (the reference frame's centre, as a crop) and
    output added to `reference`. Raises `BundleError` ``CLASSIFIER_MISMATCH`` naming the file and
    what is wrong, ``UNKNOWN_FORMAT``."""
    from pipelines.decoding.classifier import Classifier
    from pipelines.decoding.decoders import DecoderError
    from runtimes.registry import load_runtime

    if not stage.models:
        raise BundleError(ErrorCode.NO_MODEL, "a classifier stage needs at least one model")
    if not stage.labels or any(not label.strip() for label in stage.labels):
        labels = list(stage.labels)
        raise BundleError(ErrorCode.CLASSIFIER_MISMATCH, f"the classifier's labels must not be empty: {labels}")
    height, width = frame.shape[:2]
    crop = frame[height // 4 : 3 * height // 4, width // 4 : 3 * width // 4]
    entries = []
    for path in stage.models:
        if path.suffix not in (".onnx", ".tflite"):
            raise BundleError(ErrorCode.UNKNOWN_FORMAT, f"classifier {path}: expected an .onnx or .tflite model")
        runtime = load_runtime("onnxruntime" if path.suffix == ".onnx" else "litert", path)
        with runtime:
            try:
                classifier = Classifier(runtime)
            except DecoderError as exc:
                raise BundleError(ErrorCode.CLASSIFIER_MISMATCH, f"classifier {path.name}: {exc}") from exc
            if classifier.num_classes != len(stage.labels):
                raise BundleError(
                    ErrorCode.CLASSIFIER_MISMATCH,
                    f"classifier {path.name} gives {classifier.num_classes} class scores, "
                    f"but {len(stage.labels)} labels were given ({', '.join(stage.labels[:10])})",
                )
            tensor = classifier.prepare(crop)
            reference[f"{path.name}__input"] = tensor
            reference[f"{path.name}__output0"] = runtime.infer([tensor])[0]
            precision = _precision(path, runtime)
        entries.append(
            ArtifactEntry(
                path=path.name,
                format=FORMATS[path.suffix],
                precision=precision,
                sha256=sha256_file(path),
                size=path.stat().st_size,
            )
        )
    return ClassifierStage.model_validate(
        {"artifacts": entries, "labels": list(stage.labels), "for": list(stage.for_labels), "every_s": stage.every_s}
    )


def compile_tvm_modules(model: Path, targets: Sequence[Mapping[str, Any]], folder: Path) -> list[Path]:
    """`bundle build --tvm-target`: the ONNX `model` compiled by Apache TVM for each target (its
    JSON dict, `runtimes.tvm_backend.parse_target`) into `folder`, ``<stem>.<arch>-<cpu>.so`` with
    its record beside it. Raises `BundleError` ``BUILD_TOOLS_MISSING`` (no tvm, no cross linker for
    the target's triple) or ``MODEL_CHECK_FAILED`` (TVM cannot compile the model)."""
    from runtimes.base import ModelLoadError, RuntimeUnavailable
    from runtimes.tvm_backend import compile_module, target_arch

    if model.suffix != ".onnx":
        raise BundleError(ErrorCode.UNKNOWN_FORMAT, f"--tvm-target compiles an ONNX model, not {model.name}")
    made: list[Path] = []
    for target in targets:
        cpu = re.sub(r"[^A-Za-z0-9_-]", "_", str(target.get("mcpu", "generic")))[:40]
        out = folder / f"{model.stem}.{target_arch(target)}-{cpu}.so"
        if out in made:
            out = out.with_name(f"{out.stem}-{len(made)}.so")
        try:
            compile_module(model, target, out)
        except RuntimeUnavailable as exc:
            raise BundleError(ErrorCode.BUILD_TOOLS_MISSING, f"--tvm-target: {exc}") from exc
        except ModelLoadError as exc:
            raise BundleError(ErrorCode.MODEL_CHECK_FAILED, f"--tvm-target: {exc}") from exc
        made.append(out)
    return made


def _module_entry(
    path: Path,
    entries: Sequence[ArtifactEntry],
    reference: dict[str, npt.NDArray[Any]],
    notes: Mapping[str, ArtifactNotes] | None = None,
) -> ArtifactEntry:
    """The artifact of the TVM module, RKNN model or HEF `path`, its target from its record; its
    reference arrays are those of the ONNX artifact of `entries` it was made from (by its sha256);
    an RKNN model's precision is its quantization, its agreement the simulator's (`notes`); a HEF
    is int8 (Hailo's chips run quantized models), its agreement unmeasured (it cannot run here)."""
    from runtimes.base import ModelLoadError
    from runtimes.hailo_backend import HEFRecord
    from runtimes.rknn_backend import RKNNRecord
    from runtimes.tvm_backend import ModuleRecord

    try:
        record: RKNNRecord | HEFRecord | ModuleRecord = (
            RKNNRecord.read(path)
            if path.suffix == ".rknn"
            else HEFRecord.read(path)
            if path.suffix == ".hef"
            else ModuleRecord.read(path)
        )
    except ModelLoadError as exc:
        raise BundleError(ErrorCode.UNKNOWN_FORMAT, str(exc)) from exc
    source = next((e for e in entries if e.format == "onnx" and e.sha256 == record.model_sha256), None)
    if source is None:
        raise BundleError(ErrorCode.UNKNOWN_FORMAT, f"{path.name} was compiled from none of the bundle's ONNX models")
    for key in [k for k in reference if k.startswith(f"{source.path}__")]:
        reference[path.name + key[len(source.path) :]] = reference[key]
    size, digest = path.stat().st_size, sha256_file(path)
    if isinstance(record, HEFRecord):
        target = CompiledTarget(target=record.hw_arch, runtime_version=record.sdk_version or "unknown")
        return ArtifactEntry(path=path.name, format="hef", precision="int8", sha256=digest, size=size, target=target)
    if isinstance(record, RKNNRecord):
        # rknn-toolkit-lite2 runs on aarch64 only; the SoC is what the NPU checks
        target = CompiledTarget(target=record.platform, arch="aarch64", runtime_version=record.toolkit_version)
        precision: Precision = "int8" if record.quantization == "i8" else "fp16"
        agreement = (notes or {}).get(path.name, ArtifactNotes()).agreement
        return ArtifactEntry(
            path=path.name,
            format="rknn",
            precision=precision,
            sha256=digest,
            size=size,
            target=target,
            agreement=agreement,
        )
    target = CompiledTarget(
        target=json.dumps(record.target, sort_keys=True), arch=record.arch, runtime_version=record.tvm_version
    )
    return ArtifactEntry(
        path=path.name, format="tvm", precision=source.precision, sha256=digest, size=size, target=target
    )


def _hef_input(frame: npt.NDArray[Any], config: PreprocessConfig) -> npt.NDArray[Any]:
    """A HEF's reference input: `frame` as the ONNX model's input (`config`), but its pixels,
    ``(1, H, W, 3)`` uint8 NHWC, as a HEF's input stream takes them (both the Model Zoo's with
    the normalisation compiled in and one whose input quantization is the model's /255)."""
    from dataclasses import replace

    from pipelines.decoding.preprocess import preprocess

    pixels = replace(config, layout="NHWC", dtype=np.dtype(np.uint8), quantization=None, rect_stride=None)
    return preprocess(frame, pixels)[0]


def _file_entry(name: str, content: bytes | Path) -> FileEntry:
    data = content.read_bytes() if isinstance(content, Path) else content
    return FileEntry(path=name, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


def build_bundle(
    models: Sequence[Path],
    out: Path,
    *,
    name: str | None = None,
    version: str = "0.1.0",
    labels: Sequence[str] | None = None,
    decoder: str = "auto",
    calibration: Sequence[Path] = (),
    key: Ed25519PrivateKey | None = None,
    description: str = "",
    notes: Mapping[str, ArtifactNotes] | None = None,
    engines: Sequence[tuple[Path, EngineKey]] = (),
    thresholds: DetectionThresholds | ThresholdChoice | None = None,
    classifier: ClassifierInput | None = None,
    modules: Sequence[Path] = (),
) -> Manifest:
    """Write a bundle of `models` to `out`: decoder, input settings and labels come from the first
    model (its metadata) unless given; reference outputs are computed by running each model.
    `thresholds` go into the manifest, the devices' defaults for every camera, and the plausibility
    guard judges the models with them as a device will; a value not given is the first model's
    exporter's own (Ultralytics: conf 0.25, iou 0.7), else the project's (`DEFAULTS`).
    `notes` (by file name) add what `agent.optimise` measured: precision and agreement.
    `engines` are prebuilt TensorRT engines with the keys they were built for (``edge-agent
    engine build --out`` writes both); each must come from one of the ONNX `models`.
    `classifier` adds the second stage (its models, labels, the detector labels it applies to).
    `modules` are TVM modules (`compile_tvm_modules`), RKNN models
    (`agent.optimise.rknn_build.convert`) and HEFs (`runtimes.hailo_backend.write_record`), each
    made from one of the ONNX `models`, its record beside it: its reference is that model's (it
    may be for a CPU or NPU that cannot run it here); a HEF's reference input is that input's
    pixels, ``(1, H, W, 3)`` uint8, what a HEF takes (`_hef_input`).

    Raises `BundleError` ``DECODER_MISMATCH`` when the decoder does not fit a model or the
    plausibility guard finds its detections impossible (on a blank frame or the reference input);
    ``CLASSIFIER_MISMATCH`` when a classifier is not one, its scores do not match its labels, or
    it applies to a label the detector lacks.
    """
    from pipelines.decoding.decoders import DecoderError
    from pipelines.decoding.detection_filter import ThresholdChoice
    from pipelines.decoding.detector import Detector
    from runtimes.registry import load_runtime

    if not models:
        raise BundleError(ErrorCode.NO_MODEL, "a bundle needs at least one model")
    if isinstance(thresholds, DetectionThresholds):
        thresholds = ThresholdChoice(thresholds.conf, thresholds.iou, thresholds.max_det)
    choice = thresholds or ThresholdChoice()
    entries: list[ArtifactEntry] = []
    reference: dict[str, npt.NDArray[Any]] = {}
    frame = reference_frame(calibration)
    first: Detector | None = None
    weights: list[Path] = []  # OpenVINO IRs' .bin files
    for path in models:
        if path.suffix not in FORMATS:
            also = " (a HEF goes beside the ONNX model it was compiled from: bundle build --hef)"
            hint = also if path.suffix.lower() == ".hef" else ""
            raise BundleError(
                ErrorCode.UNKNOWN_FORMAT, f"{path}: expected an .onnx, .tflite or OpenVINO .xml model{hint}"
            )
        if path.suffix == ".xml":
            weights.append(path.with_suffix(".bin"))
            if not weights[-1].is_file():
                raise BundleError(ErrorCode.UNKNOWN_FORMAT, f"{path}: its weights {weights[-1].name} are not beside it")
        runtime = load_runtime(REFERENCE_RUNTIMES[FORMATS[path.suffix]], path)
        with runtime:
            try:
                chosen = choice if first is None else first.detection_filter  # every model as the first
                detector = Detector(
                    runtime, decoder if first is None else first.decoder, chosen.conf, chosen.iou, chosen.max_det
                )
                tensor, _ = detector.prepare(frame)
                outputs = runtime.infer([tensor])
                detector.check(tensor, outputs)  # the plausibility guard, on the reference input
            except DecoderError as exc:
                raise BundleError(ErrorCode.DECODER_MISMATCH, f"{path.name}: {exc}") from exc
            reference[f"{path.name}__input"] = tensor
            for i, output in enumerate(outputs):
                reference[f"{path.name}__output{i}"] = output
            note = (notes or {}).get(path.name, ArtifactNotes())
            precision = note.precision or _precision(path, runtime)
            if first is None:
                first = detector
                names = runtime.metadata.names
        entries.append(
            ArtifactEntry(
                path=path.name,
                format=FORMATS[path.suffix],
                precision=precision,
                sha256=sha256_file(path),
                size=path.stat().st_size,
                agreement=note.agreement,
            )
        )
    assert first is not None
    entries += [_module_entry(path, entries, reference, notes) for path in modules]
    config, kept = first.preprocess_config, first.detection_filter
    for path in modules:
        if path.suffix == ".hef":
            reference[f"{path.name}__input"] = _hef_input(frame, config)
    if labels is None:
        labels = [names[i] if names and i in names else str(i) for i in range(max(names) + 1)] if names else ["0"]
    stage = _classifier_entries(classifier, frame, reference) if classifier is not None else None
    if stage is not None:
        unknown = [label for label in stage.for_labels if label not in labels]
        if unknown:
            raise BundleError(
                ErrorCode.CLASSIFIER_MISMATCH,
                f"the classifier is for {', '.join(unknown)}, which the detector's labels "
                f"({', '.join(list(labels)[:10])}) do not have",
            )
    npz = io.BytesIO()
    np.savez(npz, allow_pickle=False, **reference)
    data: list[tuple[str, bytes | Path]] = [
        (LABELS, ("\n".join(labels) + "\n").encode()),
        ("reference.npz", npz.getvalue()),
        *((f"calibration/{i:04d}{p.suffix.lower()}", p) for i, p in enumerate(calibration)),
        *((p.name, p) for p, _ in engines),
        *((p.name, p) for p in weights),
        *((p.name + ".json", p.with_name(p.name + ".json")) for p in modules),
    ]
    try:
        manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            name=name or models[0].stem,
            version=version,
            task=decoder_task(first.decoder),
            description=description,
            created=datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
            decoder=first.decoder,
            input=InputSpec(
                size=first.input_hw,
                color=config.color,
                resize=config.resize,
                pad_value=config.pad_value,
                mean=config.mean,
                std=config.std,
            ),
            labels=list(labels),
            thresholds=DetectionThresholds(conf=kept.conf, iou=kept.iou, max_det=kept.max_det),
            artifacts=entries,
            files=[_file_entry(n, c) for n, c in data],
            reference=Reference(),
            calibration=Calibration(count=len(calibration)) if calibration else None,
            engines=[engine_tags(path, engine_key, entries) for path, engine_key in engines],
            classifier=stage,
        )
    except ValidationError as exc:  # a label over MAX_LABEL_CHARS, from --labels or the model's metadata
        problems = "; ".join(validation_problems(exc)[:5])
        raise BundleError(ErrorCode.MANIFEST_INVALID, f"the manifest would be invalid: {problems}") from exc
    manifest_bytes = manifest.to_bytes()
    files: list[tuple[str, bytes | Path]] = [(MANIFEST, manifest_bytes)]
    if key is not None:
        files.append((SIGNATURE, signature_file(manifest_bytes, key)))
    files += [(p.name, p) for p in [*models, *modules]]
    files += [(p.name, p) for p in (classifier.models if classifier is not None else ())]
    files += data
    write_tar(out, files)
    return manifest


def write_tar(out: Path, members: Sequence[tuple[str, bytes | Path]]) -> None:
    """Write a bundle file: `members` (name, content) in that order, atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    now = int(datetime.now(timezone.utc).timestamp())
    with atomic_writer(out) as file, tarfile.open(fileobj=file, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in members:
            payload = content.read_bytes() if isinstance(content, Path) else content
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o644, now
            tar.addfile(info, io.BytesIO(payload))
