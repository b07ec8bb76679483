"""Ed25519 signing of bundle manifests (the `cryptography` library's primitives)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from agent.errors import BundleError


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
        raise BundleError("KEY_INVALID", f"cannot read signing key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise BundleError("KEY_INVALID", f"{path} is not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError) as exc:
        raise BundleError("KEY_INVALID", f"cannot read public key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise BundleError("KEY_INVALID", f"{path} is not an Ed25519 public key")
    return key


def sign(data: bytes, key: Ed25519PrivateKey) -> bytes:
    return key.sign(data)


def verify(data: bytes, signature: bytes | None, trusted: Sequence[Ed25519PublicKey]) -> str:
    """Return the id of the trusted key that signed `data`.

    Raises `BundleError` ``SIGNATURE_MISSING`` or ``SIGNATURE_INVALID`` (no trusted key verifies
    it: a wrong signature, a modified manifest, or an unknown signer).
    """
    if signature is None:
        raise BundleError("SIGNATURE_MISSING", "the bundle is not signed (manifest.sig is missing)")
    for public in trusted:
        try:
            public.verify(signature, data)
        except InvalidSignature:
            continue
        return key_id(public)
    known = ", ".join(key_id(k) for k in trusted)
    raise BundleError(
        "SIGNATURE_INVALID",
        f"manifest.sig does not verify with any trusted key ({known}): the manifest was changed "
        "or it was signed by a key this device does not trust",
    )
