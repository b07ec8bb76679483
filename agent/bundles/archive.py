"""Model bundles: build, unpack safely, and verify.

A bundle is a tar file (optionally gzip-compressed) holding ``manifest.json``, ``manifest.sig``
(Ed25519 over the exact manifest bytes), the model artifacts, ``labels.txt``, optional
``calibration/`` images and ``reference.npz`` (per artifact: an input and the raw outputs it gave
when the bundle was built, for the device's parity check). It never carries code.

Unpacking streams the tar once and refuses absolute paths, ``..``, links, devices, duplicate
names, unexpected files, and more files or bytes than the limits (which also stops gzip bombs:
bytes are counted as they are decompressed).
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import numpy.typing as npt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import ValidationError

from agent.bundles.engine_settings import engine_tags
from agent.bundles.manifest import (
    SCHEMA_VERSION,
    Agreement,
    ArtifactEntry,
    Calibration,
    DetectionThresholds,
    FileEntry,
    InputSpec,
    Manifest,
    Reference,
)
from agent.bundles.signing import signature_file, verify
from agent.errors import BundleError, ErrorCode, validation_problems
from runtimes.base import Precision
from runtimes.engine_cache import EngineKey

MANIFEST, SIGNATURE, LABELS = "manifest.json", "manifest.sig", "labels.txt"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Limits:
    """What a device accepts from one bundle."""

    max_files: int = 256
    max_bytes: int = 1 << 30  # unpacked, all files together


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


class _HashingReader(io.RawIOBase):
    """A read-only file that hashes every byte read through it."""

    def __init__(self, raw: io.BufferedReader) -> None:
        self._raw, self.digest = raw, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        count = self._raw.readinto(buffer)
        self.digest.update(memoryview(buffer)[:count])
        return count

    def drain(self) -> str:
        """Hash what the tar reader left unread (end-of-archive padding); the file's sha256."""
        while block := self._raw.read(_CHUNK):
            self.digest.update(block)
        return self.digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


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


def _allowed(path: PurePosixPath) -> bool:
    """Only data files a bundle may carry: never anything the device would execute. (A TensorRT
    engine is data to TensorRT's runtime, which refuses engines with embedded host code unless
    told otherwise; edge-agent never tells it.)"""
    if len(path.parts) == 2 and path.parts[0] == "calibration":
        return path.suffix.lower() in (".jpg", ".jpeg", ".png")
    if len(path.parts) != 1:
        return False
    return path.name in (MANIFEST, SIGNATURE, LABELS, "reference.npz") or path.suffix in (".onnx", ".tflite", ".engine")


def unpack(bundle: Path, dest: Path, limits: Limits, fsync: bool = False, hash_bundle: bool = True) -> Unpacked:
    """Extract `bundle` into the empty folder `dest`, enforcing `limits`, hashing the files (and,
    with `hash_bundle`, the bundle itself) as it goes, so the bundle is read once.

    Raises `BundleError` (``NOT_A_TAR``, ``BUNDLE_TRUNCATED``, ``UNSAFE_PATH``, ``LINK_ENTRY``,
    ``SPECIAL_ENTRY``, ``DUPLICATE_ENTRY``, ``UNEXPECTED_FILE``, ``TOO_MANY_FILES``,
    ``TOO_LARGE``, ``DISK_FULL``); `dest` may then hold a partial extraction.
    """
    files: dict[str, str] = {}
    total = 0
    try:
        with (
            bundle.open("rb") as raw,
            tarfile.open(
                fileobj=(reader := _HashingReader(raw) if hash_bundle else raw), mode="r|*", bufsize=_CHUNK
            ) as tar,
        ):
            for member in tar:
                path = _member_path(member.name)
                if member.issym() or member.islnk():
                    raise BundleError(ErrorCode.LINK_ENTRY, f"bundle entry {member.name!r} is a link")
                if member.isdir():
                    continue
                if not member.isfile():
                    raise BundleError(
                        ErrorCode.SPECIAL_ENTRY, f"bundle entry {member.name!r} is a device, fifo or other special file"
                    )
                if str(path) in files:
                    raise BundleError(ErrorCode.DUPLICATE_ENTRY, f"bundle entry {member.name!r} appears twice")
                if not _allowed(path):
                    raise BundleError(
                        ErrorCode.UNEXPECTED_FILE, f"bundle entry {member.name!r} is not a file a bundle may carry"
                    )
                if len(files) >= limits.max_files:
                    raise BundleError(ErrorCode.TOO_MANY_FILES, f"bundle has more than {limits.max_files} files")
                digest = hashlib.sha256()
                source = tar.extractfile(member)
                assert source is not None  # a regular file always has content
                target = dest / path
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("xb") as out:
                    while chunk := source.read(_CHUNK):
                        total += len(chunk)
                        if total > limits.max_bytes:
                            raise BundleError(
                                ErrorCode.TOO_LARGE, f"bundle unpacks to more than {limits.max_bytes} bytes"
                            )
                        out.write(chunk)
                        digest.update(chunk)
                    if fsync:
                        out.flush()
                        os.fsync(out.fileno())
                files[str(path)] = digest.hexdigest()
            sha256 = reader.drain() if isinstance(reader, _HashingReader) else None
    except BundleError:
        raise
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise BundleError(ErrorCode.DISK_FULL, f"no space left while unpacking into {dest}") from exc
        if isinstance(exc, tarfile.ReadError) or "not a gzip file" in str(exc).lower():
            raise BundleError(ErrorCode.NOT_A_TAR, f"{bundle.name} is not a tar archive ({exc})") from exc
        raise BundleError(ErrorCode.UNPACK_FAILED, f"cannot unpack {bundle.name}: {exc}") from exc
    except zlib.error as exc:
        raise BundleError(ErrorCode.BUNDLE_TRUNCATED, f"{bundle.name}: compressed data is corrupt ({exc})") from exc
    except (tarfile.ReadError, tarfile.StreamError, EOFError) as exc:
        if not files and not isinstance(exc, EOFError) and "unexpected end" not in str(exc).lower():
            raise BundleError(ErrorCode.NOT_A_TAR, f"{bundle.name} is not a tar archive ({exc})") from exc
        raise BundleError(
            ErrorCode.BUNDLE_TRUNCATED, f"{bundle.name} ends early: incomplete download? ({exc})"
        ) from exc
    except tarfile.TarError as exc:
        raise BundleError(ErrorCode.NOT_A_TAR, f"{bundle.name} is not a valid tar archive ({exc})") from exc
    return Unpacked(files, sha256)


def read_manifest(folder: Path) -> tuple[bytes, Manifest]:
    path = folder / MANIFEST
    if not path.is_file():
        raise BundleError(ErrorCode.MANIFEST_MISSING, "the bundle has no manifest.json")
    data = path.read_bytes()
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BundleError(ErrorCode.MANIFEST_NOT_JSON, f"manifest.json is not JSON: {exc}") from exc
    try:
        return data, Manifest.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc)[:5])
        raise BundleError(ErrorCode.MANIFEST_INVALID, f"manifest.json: {problems}") from exc


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
    for artifact in manifest.artifacts:
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
    signer: str | None = None
    if signature is None and allow_unsigned:
        signer = None
    elif signature is not None and not trusted and allow_unsigned:
        signer = None  # signed, but this device trusts no key and accepts unsigned bundles
    elif not trusted:
        raise BundleError(
            ErrorCode.NO_TRUSTED_KEYS, "this device trusts no signing key and unsigned bundles are not allowed"
        )
    else:
        signer = verify(data, signature, trusted)
    listed = {MANIFEST, SIGNATURE}
    entries: list[ArtifactEntry | FileEntry] = [*manifest.artifacts, *manifest.files]
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
    if path.suffix == ".onnx":
        data = path.read_bytes()
        if any(op in data for op in (b"QuantizeLinear", b"ConvInteger", b"MatMulInteger", b"QLinearConv")):
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
    thresholds: DetectionThresholds | None = None,
) -> Manifest:
    """Write a bundle of `models` to `out`: decoder, input settings and labels come from the first
    model (its metadata) unless given; reference outputs are computed by running each model.
    `thresholds` (default: the manifest's defaults) go into the manifest, the devices' defaults
    for every camera, and the plausibility guard judges the models with them as a device will.
    `notes` (by file name) add what `agent.optimise` measured: precision and agreement.
    `engines` are prebuilt TensorRT engines with the keys they were built for (``edge-agent
    engine build --out`` writes both); each must come from one of the ONNX `models`.

    Raises `BundleError` ``DECODER_MISMATCH`` when the decoder does not fit a model or the
    plausibility guard finds its detections impossible (on a blank frame or the reference input).
    """
    from pipelines.decoding.decoders import DecoderError
    from pipelines.decoding.detector import Detector
    from runtimes.registry import load_runtime

    if not models:
        raise BundleError(ErrorCode.NO_MODEL, "a bundle needs at least one model")
    limits = thresholds or DetectionThresholds()
    entries: list[ArtifactEntry] = []
    reference: dict[str, npt.NDArray[Any]] = {}
    frame = reference_frame(calibration)
    first: Detector | None = None
    for path in models:
        if path.suffix not in (".onnx", ".tflite"):
            raise BundleError(ErrorCode.UNKNOWN_FORMAT, f"{path}: expected an .onnx or .tflite model")
        runtime = load_runtime("onnxruntime" if path.suffix == ".onnx" else "litert", path)
        with runtime:
            try:
                detector = Detector(
                    runtime, decoder if first is None else first.decoder, limits.conf, limits.iou, limits.max_det
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
                format="onnx" if path.suffix == ".onnx" else "tflite",
                precision=precision,
                sha256=sha256_file(path),
                size=path.stat().st_size,
                agreement=note.agreement,
            )
        )
    assert first is not None
    config = first.preprocess_config
    if labels is None:
        labels = [names[i] if names and i in names else str(i) for i in range(max(names) + 1)] if names else ["0"]
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        name=name or models[0].stem,
        version=version,
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
        thresholds=limits,
        artifacts=entries,
        reference=Reference(),
        calibration=Calibration(count=len(calibration)) if calibration else None,
    )
    npz = io.BytesIO()
    np.savez(npz, allow_pickle=False, **reference)
    data: list[tuple[str, bytes | Path]] = [
        (LABELS, ("\n".join(manifest.labels) + "\n").encode()),
        ("reference.npz", npz.getvalue()),
        *((f"calibration/{i:04d}{p.suffix.lower()}", p) for i, p in enumerate(calibration)),
        *((p.name, p) for p, _ in engines),
    ]
    tags = [engine_tags(path, engine_key, entries) for path, engine_key in engines]
    manifest = Manifest.model_validate(
        {**manifest.model_dump(), "files": [_file_entry(n, c) for n, c in data], "engines": tags}
    )
    manifest_bytes = manifest.to_bytes()
    files: list[tuple[str, bytes | Path]] = [(MANIFEST, manifest_bytes)]
    if key is not None:
        files.append((SIGNATURE, signature_file(manifest_bytes, key)))
    files += [(p.name, p) for p in models]
    files += data
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for arcname, content in files:
            payload = content.read_bytes() if isinstance(content, Path) else content
            info = tarfile.TarInfo(arcname)
            info.size, info.mode, info.mtime = len(payload), 0o644, int(datetime.now(timezone.utc).timestamp())
            tar.addfile(info, io.BytesIO(payload))
    os.replace(tmp, out)
    return manifest
