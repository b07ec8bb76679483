"""The MQTT protocol shared by devices and the operator's `edge-agent fleet` (docs/mqtt.md).

Topic names live in `Topics`; the retained documents that drive deployments (`Desired`,
`ChunkIndex`) are pydantic models with unknown keys forbidden, so both sides agree on them and
a malformed document is refused with a message instead of half-understood.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent.errors import validation_problems

DEFAULT_CHUNK_SIZE = 256 * 1024
COMMANDS = ("rollback", "restart-pipeline", "snapshot", "ping")
_SHA = r"^[0-9a-f]{64}$"


class ProtocolError(ValueError):
    """A document on the broker that does not follow the protocol."""


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

    def desired(self, device: str) -> str:
        return self.device(device, "desired")

    def group_desired(self, group: str) -> str:
        return f"{self.root}/groups/{group}/desired"

    def command(self, device: str, name: str) -> str:
        return self.device(device, f"cmd/{name}")

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
    model_config = ConfigDict(extra="forbid", frozen=True)

    def to_bytes(self) -> bytes:
        return self.model_dump_json(exclude_none=True).encode()

    @classmethod
    def parse(cls, payload: bytes | bytearray, what: str) -> Any:
        try:
            return cls.model_validate_json(payload)
        except ValidationError as exc:
            problems = "; ".join(validation_problems(exc))
            raise ProtocolError(f"{what} is not a valid {cls.__name__} document: {problems}") from exc


class ChunkIndex(_Document):
    """``<root>/bundles/<sha256>/index``: how the bundle is cut into chunks."""

    sha256: str = Field(pattern=_SHA, description="SHA-256 of the whole bundle.")
    size: int = Field(ge=1, description="Bundle size in bytes.")
    chunk_size: int = Field(ge=1, description="Bytes per chunk (the last one may be shorter).")
    chunks: list[str] = Field(min_length=1, description="SHA-256 of each chunk, in order.")
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


class Desired(_Document):
    """``<root>/<device>/desired`` or ``<root>/groups/<group>/desired``: what the device should run."""

    id: str = Field(min_length=1, max_length=200, description="Deployment id; a device acts on each id once.")
    name: str = Field(description="Bundle name (from its manifest).")
    version: str = Field(description="Bundle version (from its manifest).")
    sha256: str = Field(pattern=_SHA, description="SHA-256 of the bundle file.")
    size: int = Field(ge=1, description="Bundle size in bytes.")
    chunk_size: int = Field(ge=1, description="Bytes per chunk.")
    chunks: int = Field(ge=1, description="Number of chunks.")
    source: Literal["mqtt", "url"] = Field(default="mqtt", description="Where the chunks come from.")
    url: str | None = Field(default=None, description="HTTP(S) URL of the bundle when source is url.")
    created: str | None = Field(default=None, description="When the operator pushed it, ISO 8601 UTC.")

    @model_validator(mode="after")
    def _url_given(self) -> Desired:
        if (self.source == "url") != (self.url is not None):
            raise ValueError("a url source needs url, and url goes only with source url")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url {self.url!r} is not http(s)")
        return self


def json_payload(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), default=str).encode()
