"""Enrolment by claim: the documents a new device and the operator exchange (docs/fleet.md#enrolment).

A device installed with only a claim (`Claim`: the broker, the claim's narrow credentials, the
operator keys it will trust for the answer, a group hint, an expiry) makes its own key pairs
(`DeviceKeys`: Ed25519 to sign its request, X25519 to receive its password), and publishes an
`EnrolRequest` on its claim's topic, ``<root>/enrol/<claim>/<request id>/request``, signed with
its new Ed25519 key. The operator checks it (`check_request`), creates the device's broker client
and role, and answers on ``.../answer`` with an `EnrolAnswer` signed by an operator key, the
device's password sealed to its X25519 key (`seal`), so that neither another claim holder reading
the answer nor anyone replaying the request can use it. The device accepts the answer only when
one of the claim's operator keys signed it, for its own request and key (`accept_answer`).

Every document is bounded before it is parsed (`MAX_CLAIM_BYTES`, `MAX_ENROL_BYTES`).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.bundles.signing import key_id
from agent.config.models import TopicWord
from agent.errors import CodedError, ErrorCode, validation_problems
from agent.mqtt.protocol import ControlSignature, Topics
from runtimes.files import FileTooLarge, read_at_most

#: a claim file larger than this is refused before it is parsed
MAX_CLAIM_BYTES = 64 * 1024
#: an enrolment request or answer larger than this is refused before it is parsed
MAX_ENROL_BYTES = 16 * 1024
#: a request older than this (or from further in the future than `max_clock_skew_s`) is refused
DEFAULT_MAX_AGE_S = 24 * 3600.0

_B64_KEY = r"^[A-Za-z0-9+/]{43}=$"  # 32 raw bytes
_HEX_ID = r"^[0-9a-f]{32}$"


class EnrolRefused(CodedError):
    """A claim, request or answer that is not acted on; `code` says why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    max_bytes: ClassVar[int] = MAX_ENROL_BYTES

    @classmethod
    def parse(cls, payload: bytes | bytearray, what: str) -> Any:
        """Bounded, then validated; `EnrolRefused` (``ENROL_INVALID``) naming `what`."""
        if len(payload) > cls.max_bytes:
            raise EnrolRefused(ErrorCode.ENROL_INVALID, f"{what}: {len(payload)} bytes, more than {cls.max_bytes}")
        try:
            return cls.model_validate_json(payload)
        except ValidationError as exc:
            raise EnrolRefused(ErrorCode.ENROL_INVALID, f"{what}: {'; '.join(validation_problems(exc))}") from exc

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    def canonical_bytes(self) -> bytes:
        """What a signature covers: the kind and every member but `signature`, sorted compact JSON."""
        members = self.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
        body = json.dumps(members, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return f"edge-agent {type(self).__name__} v1\n{body}".encode()


class Claim(_Strict):
    """A claim file (YAML or JSON): what a device needs to ask to join the fleet, and no more."""

    max_bytes: ClassVar[int] = MAX_CLAIM_BYTES
    broker: str = Field(pattern=r"^mqtts?://[^\s]+$", max_length=500, description="mqtt:// or mqtts:// URL.")
    topic_root: TopicWord = Field(default="edge", description="First level of every topic.")
    claim: TopicWord = Field(description="The claim's name: its topics are <root>/enrol/<claim>/...")
    username: str = Field(min_length=1, max_length=200, description="The claim's broker user name.")
    password: str | None = Field(
        default=None, min_length=1, max_length=500, description="The claim's broker password (or cert_file)."
    )
    ca_file: Path | None = Field(default=None, description="CA certificate(s) of an mqtts:// broker.")
    cert_file: Path | None = Field(default=None, description="The claim's client certificate (PEM), for mutual TLS.")
    key_file: Path | None = Field(default=None, description="Its private key (PEM).")
    operator_keys: list[str] = Field(
        min_length=1, max_length=16, description="PEM Ed25519 public keys whose signed answer the device trusts."
    )
    group: TopicWord | None = Field(default=None, description="The group a device of this claim asks for.")
    expires_at: float = Field(ge=0, description="Unix seconds after which the claim is void.")

    @model_validator(mode="after")
    def _credential(self) -> Claim:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        if self.password is None and self.cert_file is None:
            raise ValueError("give the claim's password, or its cert_file and key_file")
        return self

    @classmethod
    def load(cls, path: Path) -> Claim:
        """Read a claim file (bounded before it is parsed); `EnrolRefused` says what is wrong."""
        data = read_bounded(path, MAX_CLAIM_BYTES, "the claim")
        try:
            raw = yaml.safe_load(data)
        except yaml.YAMLError as exc:
            raise EnrolRefused(ErrorCode.ENROL_INVALID, f"the claim {path} is neither YAML nor JSON: {exc}") from exc
        try:
            claim = cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(validation_problems(exc))
            raise EnrolRefused(ErrorCode.ENROL_INVALID, f"the claim {path}: {problems}") from exc
        claim.public_keys()  # each key must read
        return claim

    def public_keys(self) -> list[Ed25519PublicKey]:
        return [_pem_public(pem, "the claim's operator key") for pem in self.operator_keys]


class Hardware(_Strict):
    board: str = Field(max_length=200, description="The board's model (edge-agent probe).")
    serial: str = Field(max_length=200, description="Serial number, else /etc/machine-id.")
    mac: str = Field(max_length=64, description="MAC address of the first network interface.")


class EnrolRequest(_Strict):
    """``<root>/enrol/<claim>/<request_id>/request``: a device asks to join, signed by its own new key."""

    request_id: str = Field(pattern=_HEX_ID)
    claim: TopicWord
    device_id: TopicWord
    group: TopicWord | None = None
    public_key: str = Field(pattern=_B64_KEY, description="The device's Ed25519 public key, raw, base64.")
    box_key: str = Field(pattern=_B64_KEY, description="The device's X25519 public key, raw, base64.")
    hardware: Hardware
    nonce: str = Field(pattern=_HEX_ID)
    issued_at: float = Field(ge=0)
    signature: str | None = Field(default=None, max_length=200, description="By `public_key`, base64.")


class Sealed(_Strict):
    """A secret sealed to an X25519 key: an ephemeral key, ChaCha20-Poly1305 under HKDF-SHA256."""

    ephemeral: str = Field(pattern=_B64_KEY)
    nonce: str = Field(max_length=32)
    ciphertext: str = Field(max_length=2000)


class EnrolAnswer(_Strict):
    """``.../answer``: the operator's yes (credentials, keys) or no, signed by an operator key."""

    request_id: str = Field(pattern=_HEX_ID)
    device_key: str = Field(pattern=_B64_KEY, description="The public key of the request it answers.")
    approved: bool
    reason: str | None = Field(default=None, max_length=500)
    device_id: TopicWord | None = None
    group: TopicWord | None = None
    username: str | None = Field(default=None, max_length=200)
    password: Sealed | None = None
    trust_keys: list[str] = Field(default_factory=list, max_length=16)
    operator_keys: list[str] = Field(default_factory=list, max_length=16)
    issued_at: float = Field(ge=0)
    signature: ControlSignature | None = None


def enrol_topics(topics: Topics, claim: str, request_id: str) -> tuple[str, str]:
    """(request topic, answer topic) of one request."""
    base = f"{topics.root}/enrol/{claim}/{request_id}"
    return f"{base}/request", f"{base}/answer"


def _raw(key: Ed25519PublicKey | X25519PublicKey) -> str:
    return base64.b64encode(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()


def _pem_public(pem: str, what: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(pem.encode())
    except (ValueError, TypeError) as exc:
        raise EnrolRefused(ErrorCode.ENROL_INVALID, f"{what} is not a PEM public key: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise EnrolRefused(ErrorCode.ENROL_INVALID, f"{what} is not an Ed25519 public key")
    return key


def pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


@dataclass(frozen=True)
class DeviceKeys:
    """The device's own keys, made once, kept in ``<state_dir>/enrol/`` (mode 0600)."""

    signing: Ed25519PrivateKey
    box: X25519PrivateKey

    @classmethod
    def load_or_make(cls, state_dir: Path) -> DeviceKeys:
        folder = state_dir / "enrol"
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        signing = _private(folder / "device.key", Ed25519PrivateKey.generate)
        box = _private(folder / "box.key", X25519PrivateKey.generate)
        assert isinstance(signing, Ed25519PrivateKey) and isinstance(box, X25519PrivateKey)
        return cls(signing, box)


def _private(path: Path, make: Any) -> Any:
    if path.exists():
        return serialization.load_pem_private_key(path.read_bytes(), password=None)
    key = make()
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    return key


def make_request(
    keys: DeviceKeys, claim: Claim, device_id: str, hardware: Hardware, now: float, group: str | None = None
) -> EnrolRequest:
    """A new request (fresh id and nonce) signed with the device's key."""
    request = EnrolRequest(
        request_id=secrets.token_hex(16),
        claim=claim.claim,
        device_id=device_id,
        group=group or claim.group,
        public_key=_raw(keys.signing.public_key()),
        box_key=_raw(keys.box.public_key()),
        hardware=hardware,
        nonce=secrets.token_hex(16),
        issued_at=round(now, 3),
    )
    signature = base64.b64encode(keys.signing.sign(request.canonical_bytes())).decode()
    return request.model_copy(update={"signature": signature})


def check_request(
    request: EnrolRequest, claim: str, request_id: str, now: float, max_age_s: float, skew_s: float
) -> None:
    """The operator's checks of a request read from ``<root>/enrol/<claim>/<request_id>/request``:
    it names that claim and id, its own key signed it, and it is fresh. `EnrolRefused` otherwise."""
    if request.claim != claim or request.request_id != request_id:
        raise EnrolRefused(ErrorCode.ENROL_FORGED, f"request {request_id} names another claim or id than its topic's")
    if request.signature is None:
        raise EnrolRefused(ErrorCode.ENROL_FORGED, f"request {request_id} is not signed")
    public = Ed25519PublicKey.from_public_bytes(base64.b64decode(request.public_key))
    try:
        public.verify(base64.b64decode(request.signature, validate=True), request.canonical_bytes())
    except (InvalidSignature, ValueError) as exc:
        raise EnrolRefused(ErrorCode.ENROL_FORGED, f"request {request_id}: its signature does not match") from exc
    if request.issued_at > now + skew_s:
        raise EnrolRefused(ErrorCode.ENROL_EXPIRED, f"request {request_id} was issued in the future (a clock off?)")
    if request.issued_at < now - max_age_s:
        raise EnrolRefused(
            ErrorCode.ENROL_EXPIRED,
            f"request {request_id} is {now - request.issued_at:.0f} s old (at most {max_age_s:.0f})",
        )


def _box_key(shared: bytes, request_id: str) -> bytes:
    hkdf = HKDF(hashes.SHA256(), 32, salt=None, info=f"edge-agent enrol {request_id}".encode())
    return hkdf.derive(shared)


def seal(secret: str, box_key: str, request_id: str) -> Sealed:
    """`secret` sealed to the device's X25519 key (`box_key`, base64 raw), bound to `request_id`."""
    ephemeral = X25519PrivateKey.generate()
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(base64.b64decode(box_key)))
    nonce = os.urandom(12)
    ciphertext = ChaCha20Poly1305(_box_key(shared, request_id)).encrypt(nonce, secret.encode(), None)
    b64 = base64.b64encode
    return Sealed(
        ephemeral=_raw(ephemeral.public_key()), nonce=b64(nonce).decode(), ciphertext=b64(ciphertext).decode()
    )


def unseal(sealed: Sealed, box: X25519PrivateKey, request_id: str) -> str:
    try:
        shared = box.exchange(X25519PublicKey.from_public_bytes(base64.b64decode(sealed.ephemeral)))
        nonce, ciphertext = base64.b64decode(sealed.nonce), base64.b64decode(sealed.ciphertext)
        return ChaCha20Poly1305(_box_key(shared, request_id)).decrypt(nonce, ciphertext, None).decode()
    except (InvalidTag, ValueError) as exc:
        raise EnrolRefused(ErrorCode.ENROL_FORGED, "the sealed password does not open with this device's key") from exc


def sign_answer(answer: EnrolAnswer, key: Ed25519PrivateKey) -> EnrolAnswer:
    value = base64.b64encode(key.sign(answer.canonical_bytes())).decode()
    return answer.model_copy(update={"signature": ControlSignature(key_id=key_id(key.public_key()), value=value)})


def accept_answer(answer: EnrolAnswer, request: EnrolRequest, trusted: list[Ed25519PublicKey]) -> EnrolAnswer:
    """The device's checks: one of the claim's operator keys signed `answer`, for this request
    and this device's key. `EnrolRefused` otherwise (the device keeps waiting)."""
    verify_signed(answer.canonical_bytes(), answer.signature, trusted, "the answer")
    if answer.request_id != request.request_id or answer.device_key != request.public_key:
        raise EnrolRefused(ErrorCode.ENROL_FORGED, "the answer is for another request")
    return answer


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """A file's bytes, refused (``ENROL_INVALID``) when it cannot be read or is over `limit`
    bytes, which are all that is read."""
    try:
        return read_at_most(path, limit)
    except FileTooLarge as exc:
        raise EnrolRefused(ErrorCode.ENROL_INVALID, f"{what} {path} is larger than {limit} bytes") from exc
    except OSError as exc:
        raise EnrolRefused(ErrorCode.ENROL_INVALID, f"cannot read {what} {path}: {exc.strerror}") from exc


def verify_signed(data: bytes, signature: ControlSignature | None, keys: Sequence[Ed25519PublicKey], what: str) -> None:
    """`signature` is one of `keys`' over `data`; `EnrolRefused` (``ENROL_FORGED``) otherwise."""
    key = {key_id(k): k for k in keys}.get(signature.key_id) if signature is not None else None
    if signature is None or key is None:
        raise EnrolRefused(ErrorCode.ENROL_FORGED, f"{what} is not signed by a key given for it")
    try:
        key.verify(base64.b64decode(signature.value, validate=True), data)
    except (InvalidSignature, ValueError) as exc:
        raise EnrolRefused(
            ErrorCode.ENROL_FORGED, f"{what}: the signature does not match (changed after signing?)"
        ) from exc
