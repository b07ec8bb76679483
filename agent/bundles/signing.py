"""Ed25519 signing of bundle manifests (the `cryptography` library's primitives)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agent.errors import BundleError, ErrorCode


def key_id(public: Ed25519PublicKey) -> str:
    """A short, stable name for a public key: the first 16 hex digits of its SHA-256."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_keypair(folder: Path) -> tuple[Path, Path]:
    """Write ``signing.key`` (PKCS#8 PEM, mode 0600) and ``signing.pub`` into `folder`.

    Refuses to overwrite an existing key: losing a fleet's signing key is not undoable.
    """
    private_path, public_path = folder / "signing.key", folder / "signing.pub"
    for path in (private_path, public_path):
        if path.exists():
            raise FileExistsError(f"{path} already exists; move it away first")
    folder.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(private_pem)
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private_path, public_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise BundleError(ErrorCode.KEY_INVALID, f"cannot read signing key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise BundleError(ErrorCode.KEY_INVALID, f"{path} is not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise BundleError(ErrorCode.KEY_INVALID, f"cannot read public key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise BundleError(ErrorCode.KEY_INVALID, f"{path} is not an Ed25519 public key")
    return key


def signature_file(data: bytes, key: Ed25519PrivateKey) -> bytes:
    """The content of manifest.sig: JSON ``{"key_id": ..., "signature": base64}`` over `data`."""
    signature = base64.b64encode(key.sign(data)).decode()
    return json.dumps({"key_id": key_id(key.public_key()), "signature": signature}).encode() + b"\n"


def verify(data: bytes, signature_json: bytes | None, trusted: Sequence[Ed25519PublicKey]) -> str:
    """Return the id of the trusted key whose signature over `data` is in `signature_json`.

    Raises `BundleError`: ``SIGNATURE_MISSING``, ``UNKNOWN_SIGNER`` (signed by a key this device
    does not trust) or ``SIGNATURE_INVALID`` (malformed, or the manifest changed after signing).
    """
    if signature_json is None:
        raise BundleError(ErrorCode.SIGNATURE_MISSING, "the bundle is not signed (manifest.sig is missing)")
    try:
        parsed = json.loads(signature_json)
        signer, signature = str(parsed["key_id"]), base64.b64decode(parsed["signature"], validate=True)
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(ErrorCode.SIGNATURE_INVALID, f"manifest.sig is malformed: {exc}") from exc
    by_id = {key_id(k): k for k in trusted}
    if signer not in by_id:
        known = ", ".join(by_id) or "none"
        raise BundleError(
            ErrorCode.UNKNOWN_SIGNER, f"signed by key {signer}, which this device does not trust (trusted: {known})"
        )
    try:
        by_id[signer].verify(signature, data)
    except InvalidSignature as exc:
        raise BundleError(
            ErrorCode.SIGNATURE_INVALID,
            f"the signature of key {signer} does not match manifest.json: changed after signing?",
        ) from exc
    return signer
