"""Agent bundles: edge-agent's own wheels, signed, for one target Python and architecture
(docs/fleet.md#agent-updates).

The same archive as a model bundle (agent/bundles/archive.py: manifest.json first, manifest.sig
right after it, then only the files the manifest lists, every limit of `unpack`), its manifest
an `AgentManifest` (``kind: agent``) and its files wheels alone. An agent bundle is code: a
device installs one only when a key it trusts signed it, whatever ``allow_unsigned`` says for
model bundles (`unpack_agent` checks the signature before it inflates a wheel).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import ValidationError

from agent.bundles.archive import (
    MANIFEST,
    SIGNATURE,
    Limits,
    Trust,
    manifest_json,
    model_member,
    opened_bundle,
    validated,
    write_tar,
)
from agent.bundles.manifest import MAX_WHEELS, SCHEMA_VERSION, AgentManifest, WheelEntry
from agent.bundles.signing import signature_file
from agent.bundles.wheels import WheelTags, fits_target, wheel_tags
from agent.errors import BundleError, ErrorCode, validation_problems
from runtimes.files import sha256_file

BundleKind = Literal["model", "agent"]
_ARCH = re.compile(r"(aarch64|x86_64|armv7l|armv6l|riscv64|ppc64le|s390x|i686)$")


def _agent_member(path: PurePosixPath) -> bool:
    """What an agent bundle may carry: its manifest, its signature and wheels, at the top level."""
    return len(path.parts) == 1 and (path.name in (MANIFEST, SIGNATURE) or path.suffix == ".whl")


def _any_member(path: PurePosixPath) -> bool:
    """What either kind of bundle may carry: for reading a head, before the kind is known."""
    return model_member(path) or _agent_member(path)


@dataclass(frozen=True)
class AgentHead:
    """An agent bundle's manifest (its exact bytes, parsed) and manifest.sig's bytes (None: unsigned)."""

    data: bytes
    manifest: AgentManifest
    signature: bytes | None


def parse_agent_manifest(data: bytes) -> AgentManifest:
    """manifest.json's bytes as an `AgentManifest`; `BundleError` ``WRONG_BUNDLE_KIND`` for a
    model bundle's, ``MANIFEST_NOT_JSON`` or ``MANIFEST_INVALID``."""
    raw = manifest_json(data)
    if not isinstance(raw, dict) or raw.get("kind") != "agent":
        raise BundleError(
            ErrorCode.WRONG_BUNDLE_KIND,
            "this is a model bundle, not an agent bundle (kind: agent): push it without --agent",
        )
    return validated(AgentManifest, raw)


def bundle_kind(bundle: Path) -> BundleKind:
    """Whether the bundle file is a model bundle or an agent bundle, from its manifest alone."""
    with opened_bundle(bundle, Limits(), False, _any_member) as (opened, _):
        data, _signature, _next = opened.raw_head(None)
    raw = manifest_json(data)
    return "agent" if isinstance(raw, dict) and raw.get("kind") == "agent" else "model"


def read_agent_head(bundle: Path) -> AgentHead:
    """The manifest and signature (unchecked) of an agent bundle file, nothing else inflated."""
    with opened_bundle(bundle, Limits(), False, _any_member) as (opened, _):
        data, signature, _next = opened.raw_head(None)
    return AgentHead(data, parse_agent_manifest(data), signature)


def unpack_agent(
    bundle: Path, dest: Path, limits: Limits, trusted: Sequence[Ed25519PublicKey], hash_bundle: bool = False
) -> tuple[AgentManifest, str | None]:
    """Extract the agent bundle into the empty folder `dest`: the signature checked against
    `trusted` first (never unsigned: ``NO_TRUSTED_KEYS``, ``SIGNATURE_MISSING``,
    ``UNKNOWN_SIGNER``, ``SIGNATURE_INVALID``), then every wheel the manifest lists, within
    `limits`, each hashed as it is written (``ARTIFACT_HASH_MISMATCH``), and the bundle's own
    sha256 when `hash_bundle`. Every other code of `archive.unpack`."""
    with opened_bundle(bundle, limits, hash_bundle, _agent_member) as (opened, source):
        data, signature, member = opened.raw_head(Trust(trusted, allow_unsigned=False))
        manifest = parse_agent_manifest(data)
        sizes = {wheel.path: wheel.size for wheel in manifest.wheels}
        files = opened.extract_listed(data, signature, sizes, member, dest, fsync=True)
        sha256 = source.drain()
    for wheel in manifest.wheels:
        if wheel.path not in files:
            raise BundleError(
                ErrorCode.ARTIFACT_MISSING, f"{wheel.path} is listed in the manifest but not in the bundle"
            )
        if files[wheel.path] != wheel.sha256:
            raise BundleError(
                ErrorCode.ARTIFACT_HASH_MISMATCH,
                f"{wheel.path} hashes to {files[wheel.path][:12]}, not {wheel.sha256[:12]}",
            )
    return manifest, sha256


def _target(tags: Sequence[WheelTags], python: str | None, arch: str | None) -> tuple[str, str]:
    """The target the wheels are for: `python` and `arch` as given, else what the wheels say
    (``py3`` and ``any`` when all are pure Python; else the first wheel's that is not)."""
    if python is None:
        native = [tag for wheel in tags if "py3" not in wheel.pythons for tag in wheel.pythons]
        python = native[0] if native else "py3"
    if arch is None:
        platforms = [tag for wheel in tags for tag in wheel.platforms if tag != "any"]
        found = _ARCH.search(platforms[0]) if platforms else None
        if platforms and found is None:
            raise BundleError(
                ErrorCode.AGENT_UPDATE_WRONG_ARCHITECTURE,
                f"cannot tell the architecture of {platforms[0]}: name it with --arch",
            )
        arch = found[1] if found is not None else "any"
    return python, arch


def build_agent_bundle(
    wheels: Sequence[Path],
    out: Path,
    key: Ed25519PrivateKey,
    *,
    python: str | None = None,
    arch: str | None = None,
    description: str = "",
) -> AgentManifest:
    """Write a signed agent bundle of `wheels` to `out`, for the target `python` (``py3`` or one
    version, ``cp311``) and `arch` (``any`` or one, ``aarch64``), by default what the wheels say.
    Raises `BundleError`: ``AGENT_UPDATE_MALFORMED`` (not wheels, not exactly one edge-agent
    wheel, too many), ``AGENT_UPDATE_WRONG_PYTHON`` / ``AGENT_UPDATE_WRONG_ARCHITECTURE`` (a
    wheel that does not fit the target, named with both), ``MANIFEST_INVALID``."""
    if len(wheels) > MAX_WHEELS:
        raise BundleError(ErrorCode.AGENT_UPDATE_MALFORMED, f"at most {MAX_WHEELS} wheels, not {len(wheels)}")
    tags = []
    for wheel in wheels:
        tag = wheel_tags(wheel.name)
        if tag is None:
            raise BundleError(ErrorCode.AGENT_UPDATE_MALFORMED, f"{wheel.name} is not a wheel's file name")
        tags.append(tag)
    agents = [tag for tag in tags if tag.is_agent]
    if len(agents) != 1:
        raise BundleError(
            ErrorCode.AGENT_UPDATE_MALFORMED, f"an agent bundle holds one edge-agent wheel, not {len(agents)}"
        )
    python, arch = _target(tags, python, arch)
    for wheel, tag in zip(wheels, tags, strict=True):
        misfit = fits_target(tag, python, arch)
        if misfit is not None:
            code = (
                ErrorCode.AGENT_UPDATE_WRONG_PYTHON
                if misfit[0] == "python"
                else ErrorCode.AGENT_UPDATE_WRONG_ARCHITECTURE
            )
            raise BundleError(code, f"{wheel.name} does not fit the bundle's target: {misfit[1]}")
    try:
        manifest = AgentManifest(
            schema_version=SCHEMA_VERSION,
            kind="agent",
            version=agents[0].version,
            description=description,
            created=datetime.now(timezone.utc).replace(microsecond=0).isoformat(),
            python=python,
            arch=arch,
            wheels=[WheelEntry(path=w.name, sha256=sha256_file(w), size=w.stat().st_size) for w in wheels],
        )
    except ValidationError as exc:
        problems = "; ".join(validation_problems(exc)[:5])
        raise BundleError(ErrorCode.MANIFEST_INVALID, f"the manifest would be invalid: {problems}") from exc
    data = manifest.to_bytes()
    members: list[tuple[str, bytes | Path]] = [(MANIFEST, data), (SIGNATURE, signature_file(data, key))]
    members += [(wheel.name, wheel) for wheel in wheels]
    write_tar(out, members)
    return manifest
