"""The MQTT protocol shared by devices and the operator's `edge-agent fleet` (docs/mqtt.md).

Topic names live in `Topics`; the documents that drive a device (`Desired`, `Release`,
`CommandRequest`, `ChunkIndex`) are pydantic models with unknown keys forbidden and every string
bounded, so both sides agree on them and a malformed or oversized document is refused with a
message instead of half-understood. Control documents (`Signed`: desired, release, commands)
carry an operator's signature over `canonical_bytes` (agent/mqtt/control.py checks it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.errors import ErrorCode, validation_problems
from agent.mqtt.commands import COMMAND_TABLE
from agent.mqtt.quality_request import QualityRequest, ShadowRequest
from agent.mqtt.rollout_schedule import Rollout

DEFAULT_CHUNK_SIZE = 256 * 1024
#: the commands a device accepts, by name (`agent.mqtt.commands.COMMAND_TABLE` declares them)
COMMANDS = tuple(command.name for command in COMMAND_TABLE)
#: a desired document, release or command larger than this is refused unread
MAX_CONTROL_BYTES = 16 * 1024
#: the most chunks a bundle may be cut into (16 GiB in chunks of 256 KiB)
MAX_CHUNKS = 1 << 16
_SHA = r"^[0-9a-f]{64}$"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"  # bundle names, as in the manifest
_TARGET = r"^(device|group):[A-Za-z0-9_.-]{1,128}$"

# -- protocol versions (docs/fleet.md#protocol-versions) --------------------------------------
#: the newest protocol of the documents a device reads (desired documents, releases, commands)
#: that this agent understands, and the one its status says it speaks; a document without
#: ``protocol`` is protocol 1 (what every operator wrote before the field existed)
PROTOCOL = 1
#: the highest ``protocol`` a document may state (anything higher is junk, not a future protocol)
MAX_PROTOCOL = 1000


class ProtocolError(ValueError):
    """A document on the broker that does not follow the protocol."""


class ProtocolTooNew(ProtocolError):
    """A control document of a protocol newer than `PROTOCOL`: refused unread, never half-read
    (its str starts with ``PROTOCOL_TOO_NEW``, the code a command's answer carries)."""

    code = ErrorCode.PROTOCOL_TOO_NEW

    def __init__(self, what: str, protocol: int) -> None:
        self.message = (
            f"{what} is a protocol {protocol} document; this agent reads protocol {PROTOCOL} and older: "
            "update edge-agent on this device"
        )
        super().__init__(f"{self.code}: {self.message}")
        self.protocol = protocol


def written_protocol() -> int | None:
    """The ``protocol`` the operator writes in a control document: none while `PROTOCOL` is 1
    (absent reads as 1, and agents before 0.2.0 refuse a document with a key they do not know),
    `PROTOCOL` from protocol 2 on."""
    return PROTOCOL if PROTOCOL > 1 else None


def stated_protocol(payload: bytes | bytearray) -> int | None:
    """The ``protocol`` a JSON object `payload` states when it is a whole number (None: absent,
    not JSON, or not a number; the model's own check then says what is wrong). Callers bound
    the payload's size first."""
    try:
        raw = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    value = raw.get("protocol") if isinstance(raw, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Topics:
    """Topic names under `root` (default ``edge``)."""

    root: str = "edge"

    def device(self, device: str, leaf: str) -> str:
        return f"{self.root}/{device}/{leaf}"

    def split_device(self, topic: str) -> tuple[str, str]:
        """A device topic back into (device, leaf): the inverse of `device`."""
        device, leaf = topic[len(self.root) + 1 :].split("/", 1)
        return device, leaf

    def status(self, device: str) -> str:
        return self.device(device, "status")

    def telemetry(self, device: str) -> str:
        return self.device(device, "telemetry")

    def events(self, device: str) -> str:
        return self.device(device, "events")

    def report(self, device: str) -> str:
        """The optimisation report (retained): every way to run the active version, measured."""
        return self.device(device, "report")

    def deployment(self, device: str) -> str:
        return self.device(device, "deployment")

    def deployments(self, device: str) -> str:
        """Each state a deployment reached, as a report through the outbox (not retained)."""
        return self.device(device, "deployments")

    def desired(self, device: str) -> str:
        return self.device(device, "desired")

    def group_desired(self, group: str) -> str:
        return f"{self.root}/groups/{group}/desired"

    def command(self, device: str, name: str) -> str:
        return self.device(device, f"cmd/{name}")

    @property
    def replies(self) -> str:
        """The reply space: devices answer commands only on topics under it."""
        return f"{self.root}/replies"

    def reply(self, token: str) -> str:
        return f"{self.replies}/{token}"

    def is_reply_topic(self, topic: str) -> bool:
        """Whether `topic` is a concrete topic in the reply space (one level below it, no wildcards)."""
        token = topic.removeprefix(self.replies + "/")
        return topic.startswith(self.replies + "/") and bool(token) and not any(c in token for c in "/+#\x00")

    def index(self, sha256: str) -> str:
        return f"{self.root}/bundles/{sha256}/index"

    def chunk(self, sha256: str, i: int) -> str:
        return f"{self.root}/bundles/{sha256}/{i}"

    def target_desired(self, target: str) -> str:
        """``device:ID`` or ``group:NAME`` to its desired topic; raises `ProtocolError` otherwise."""
        kind, _, name = target.partition(":")
        if not name or kind not in ("device", "group") or any(c in name for c in "/+#"):
            raise ProtocolError(f"target {target!r} is not device:ID or group:NAME")
        return self.desired(name) if kind == "device" else self.group_desired(name)


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # Infinity, NaN refused
    #: a larger payload is refused before it is parsed
    max_bytes: ClassVar[int] = MAX_CONTROL_BYTES

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    @classmethod
    def parse(cls, payload: bytes | bytearray, what: str) -> Any:
        if len(payload) > cls.max_bytes:
            raise ProtocolError(
                f"{what} is not a valid {cls.__name__} document: {len(payload)} bytes, more than {cls.max_bytes}"
            )
        try:
            return cls.model_validate_json(payload)
        except ValidationError as exc:
            problems = "; ".join(validation_problems(exc))
            raise ProtocolError(f"{what} is not a valid {cls.__name__} document: {problems}") from exc


class ChunkIndex(_Document):
    """``<root>/bundles/<sha256>/index``: how the bundle is cut into chunks."""

    max_bytes: ClassVar[int] = MAX_CHUNKS * 70 + 1024

    sha256: str = Field(pattern=_SHA, description="SHA-256 of the whole bundle.")
    size: int = Field(ge=1, description="Bundle size in bytes.")
    chunk_size: int = Field(ge=1, description="Bytes per chunk (the last one may be shorter).")
    chunks: list[str] = Field(min_length=1, max_length=MAX_CHUNKS, description="SHA-256 of each chunk, in order.")
    created: datetime | None = Field(default=None, description="When it was pushed (fleet gc spares young ones).")

    @model_validator(mode="after")
    def _consistent(self) -> ChunkIndex:
        expected = -(-self.size // self.chunk_size)
        if len(self.chunks) != expected:
            count = len(self.chunks)
            raise ValueError(f"{self.size} bytes in chunks of {self.chunk_size} make {expected} chunks, not {count}")
        return self

    def span(self, i: int) -> tuple[int, int]:
        """Byte offset and length of chunk `i`."""
        start = i * self.chunk_size
        return start, min(self.chunk_size, self.size - start)

    @classmethod
    def of(cls, data: bytes, chunk_size: int = DEFAULT_CHUNK_SIZE) -> ChunkIndex:
        return cls(
            sha256=hashlib.sha256(data).hexdigest(),
            size=len(data),
            chunk_size=chunk_size,
            chunks=[hashlib.sha256(data[i : i + chunk_size]).hexdigest() for i in range(0, len(data), chunk_size)],
        )


class ControlSignature(_Document):
    """An operator's Ed25519 signature over a control document's `canonical_bytes`."""

    key_id: str = Field(pattern=r"^[0-9a-f]{16}$", description="Id of the signing key (edge-agent keygen).")
    value: str = Field(min_length=1, max_length=200, description="The signature, base64.")


class Signed(_Document):
    """A control document: what it is for (`target`), when it was issued, and by whom (`signature`).

    `target` and `issued_at` are required once signed; an unsigned document (accepted only where
    the device allows unsigned control) may leave them out. `protocol` (absent: 1) is inside
    what is signed; a document of a protocol newer than `PROTOCOL` is refused by `parse` with
    `ProtocolTooNew` before its members are read.
    """

    protocol: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PROTOCOL,
        strict=True,  # "2" or 2.0 is no protocol: it would slip past `parse`'s check of a newer one
        description="The protocol this document follows (absent: 1); a device that reads an older one refuses it.",
    )
    target: str | None = Field(default=None, pattern=_TARGET, description="device:ID or group:NAME it is for.")
    issued_at: float | None = Field(default=None, ge=0, description="When the operator issued it, Unix seconds.")
    signature: ControlSignature | None = Field(default=None, description="The operator's signature.")

    @classmethod
    def parse(cls, payload: bytes | bytearray, what: str) -> Any:
        """As `_Document.parse`, but a document of a newer protocol is refused as such
        (`ProtocolTooNew`), not as one with unknown keys."""
        stated = stated_protocol(payload) if len(payload) <= cls.max_bytes else None
        if stated is not None and PROTOCOL < stated <= MAX_PROTOCOL:
            raise ProtocolTooNew(what, stated)
        return super().parse(payload, what)

    def canonical_bytes(self) -> bytes:
        """What the signature covers: the document's kind and its members but `signature`, as
        compact JSON with sorted keys, so a signature cannot be moved to another kind."""
        members = self.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
        body = json.dumps(members, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return f"edge-agent {type(self).__name__} v1\n{body}".encode()


class Desired(Signed):
    """``<root>/<device>/desired`` or ``<root>/groups/<group>/desired``: what the device should run."""

    id: str = Field(min_length=1, max_length=200, description="Deployment id; a device acts on each id once.")
    name: str = Field(pattern=_NAME, description="Bundle name (from its manifest).")
    version: str = Field(min_length=1, max_length=64, description="Bundle version (from its manifest).")
    sha256: str = Field(pattern=_SHA, description="SHA-256 of the bundle file.")
    size: int = Field(ge=1, description="Bundle size in bytes.")
    chunk_size: int = Field(ge=1, description="Bytes per chunk.")
    chunks: int = Field(ge=1, le=MAX_CHUNKS, description="Number of chunks.")
    source: Literal["mqtt", "url"] = Field(default="mqtt", description="Where the chunks come from.")
    url: str | None = Field(default=None, max_length=2048, description="HTTP(S) URL of the bundle when source is url.")
    created: str | None = Field(default=None, max_length=40, description="When the operator pushed it, ISO 8601 UTC.")
    allow_downgrade: bool = Field(
        default=False, description="Install even if the device has a higher version of this bundle installed."
    )
    rollout: Rollout | None = Field(
        default=None,
        description="A staged rollout's schedule and halt (agent/mqtt/rollout_schedule.py); none: all at once.",
    )
    shadow: ShadowRequest | None = Field(
        default=None,
        description="Judge the new version on live frames beside the serving one before it switches "
        "(docs/quality.md); none: as agent.yaml's deployments.shadow says.",
    )
    quality: QualityRequest | None = Field(
        default=None, description="Probation's quality threshold for this deployment (docs/quality.md)."
    )

    @model_validator(mode="after")
    def _url_given(self) -> Desired:
        if (self.source == "url") != (self.url is not None):
            raise ValueError("a url source needs url, and url goes only with source url")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is not http(s)")
        return self


class Release(Signed):
    """On ``<root>/<device>/desired``: the device follows its group's desired document again
    (the signed form of clearing the device's own document)."""

    id: str = Field(min_length=1, max_length=200, description="Id of this release; acted on once.")
    release: Literal[True] = Field(description="Always true: marks a release.")


class CommandRequest(Signed):
    """A command on ``<root>/<device>/cmd/<name>``: the operator's signed envelope of its arguments."""

    id: str = Field(min_length=1, max_length=200, description="Request id; a device runs each id once.")
    command: str = Field(min_length=1, max_length=64, description="The command's name; must match the topic.")
    args: dict[str, Any] = Field(default_factory=dict, description="The command's arguments (docs/mqtt.md).")


def json_payload(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), default=str).encode()
