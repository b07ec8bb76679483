"""Pushing a bundle: its chunks, index and desired document left retained on the broker (a
device that is offline now catches up when it connects), and following the devices' records
until each deployment ends. Desired documents and releases are signed with the operator's key.

Chunks are cut to fit the broker's Maximum Packet Size (from its CONNACK, `MqttLink.limits`):
a broker closes the connection of a client that sends a larger packet. A push to a group may
carry a staged rollout (`Staging`, agent/fleet/rollout_watch.py) whose waves start when the desired
document is published."""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.bundles.agent_bundle import read_agent_head
from agent.bundles.archive import read_bundle_manifest
from agent.bundles.manifest import AgentManifest, Manifest
from agent.bundles.record import FINAL_STATES
from agent.errors import BundleError, ErrorCode
from agent.fleet.client import FleetError, publish_retained, wait_acked
from agent.fleet.rollout_watch import Staging
from agent.mqtt.control import sign
from agent.mqtt.device_documents import DeploymentDocument, Unreadable
from agent.mqtt.limits import fit_chunk_size, publish_packet_size
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import DEFAULT_CHUNK_SIZE, MAX_CHUNKS, ChunkIndex, Desired, Release, Topics, written_protocol
from agent.mqtt.quality_request import QualityRequest, ShadowRequest


def bundle_manifest(bundle: Path, agent: bool = False) -> Manifest | AgentManifest:
    """Read the manifest out of a bundle file (plain or compressed) without inflating the rest:
    a model bundle's, or with `agent` an agent bundle's (each refuses the other kind, saying so)."""
    try:
        return read_agent_head(bundle).manifest if agent else read_bundle_manifest(bundle).manifest
    except OSError as exc:
        raise BundleError(ErrorCode.NOT_A_BUNDLE, f"{bundle} cannot be read: {exc.strerror}") from exc
    except BundleError as exc:
        raise BundleError(ErrorCode.NOT_A_BUNDLE, f"{bundle} is not a bundle: {exc}") from exc


def push(
    link: MqttLink,
    topics: Topics,
    bundle: Path,
    target: str,
    *,
    chunk_size: int | None = None,
    url: str | None = None,
    key: Ed25519PrivateKey | None = None,
    allow_downgrade: bool = False,
    staging: Staging | None = None,
    deployment_id: str | None = None,
    shadow: ShadowRequest | None = None,
    quality: QualityRequest | None = None,
    progress: Callable[[int], None] = lambda n: None,
    notice: Callable[[str], None] = lambda text: None,
    timeout: float = 600.0,
    agent: bool = False,
) -> Desired:
    """Publish the bundle's chunks (unless `url` serves it) and index, then, once the broker has
    acknowledged them, the desired document for `target` (``device:ID`` or ``group:NAME``),
    signed by the operator's `key`; all retained, QoS 1. `chunk_size` (None: the default) is
    lowered to fit the broker's maximum packet size, and `notice` says so; `staging` makes it a
    staged rollout (a group only); `deployment_id` names the deployment (default: name, version
    and a random suffix); `shadow` and `quality` are signed with it (docs/quality.md). `agent`:
    the bundle is an agent bundle (edge-agent itself, docs/fleet.md#agent-updates), sent the
    same way; a shadow or quality check is for models only.
    `progress` gets the bytes acknowledged so far."""
    desired_topic = topics.target_desired(target)
    if staging is not None and not target.startswith("group:"):
        raise FleetError(f"a staged rollout (--waves) goes to a group, not to {target}")
    chunk_size = _chunk_size(link, topics, chunk_size, url, notice)
    if agent and (shadow is not None or quality is not None):
        raise FleetError("an agent bundle has no shadow or quality check: those judge a model")
    manifest = bundle_manifest(bundle, agent)
    data = memoryview(bundle.read_bytes())
    sha256 = hashlib.sha256(data).hexdigest()  # names the chunk topics, so it comes first
    chunks, infos = [], []
    for start in range(0, len(data), chunk_size):
        piece = data[start : start + chunk_size]
        chunks.append(hashlib.sha256(piece).hexdigest())  # hashing overlaps paho sending the previous chunk
        if url is None:
            infos.append(publish_retained(link, topics.chunk(sha256, len(chunks) - 1), piece.tobytes()))
    created = datetime.now(timezone.utc).replace(microsecond=0)
    index = ChunkIndex(sha256=sha256, size=len(data), chunk_size=chunk_size, chunks=chunks, created=created)
    _check_fits(
        link, topics.index(sha256), index.to_bytes(), "its chunk index: push with a larger --chunk-size or --url"
    )
    infos.append(publish_retained(link, topics.index(sha256), index.to_bytes()))
    done = 0
    for i, info in enumerate(infos[:-1]):
        wait_acked([info], link, timeout)
        done += index.span(i)[1]
        progress(done)
    wait_acked(infos[-1:], link, timeout)
    desired = Desired(
        id=deployment_id or f"{manifest.name}-{manifest.version}-{uuid.uuid4().hex[:8]}",
        name=manifest.name,
        version=manifest.version,
        sha256=index.sha256,
        size=index.size,
        chunk_size=chunk_size,
        chunks=len(index.chunks),
        source="url" if url else "mqtt",
        url=url,
        created=created.isoformat(),
        target=target,
        allow_downgrade=allow_downgrade,
        shadow=shadow,
        quality=quality,
        protocol=written_protocol(),
    )
    now = time.time()
    if staging is not None:
        desired = desired.model_copy(update={"rollout": staging.schedule(round(now, 3))})
    if key is not None:
        desired = sign(desired, key, target, now)
    wait_acked([publish_retained(link, desired_topic, desired.to_bytes())], link, timeout)
    return desired


def _chunk_size(
    link: MqttLink, topics: Topics, requested: int | None, url: str | None, notice: Callable[[str], None]
) -> int:
    """The chunk size to push: `requested` or the default, cut to the broker's maximum packet
    size when the chunks go over MQTT (the longest chunk topic counts)."""
    if url is not None:
        return requested or DEFAULT_CHUNK_SIZE  # HTTP ranges: the broker never carries a chunk
    try:
        size, why = fit_chunk_size(requested, link.limits, topics.chunk("0" * 64, MAX_CHUNKS))
    except ValueError as exc:
        raise FleetError(str(exc)) from exc
    if why is not None:
        notice(why)
    return size


def _check_fits(link: MqttLink, topic: str, payload: bytes, advice: str) -> None:
    limits = link.limits
    size = publish_packet_size(topic, len(payload))
    if limits is not None and not limits.fits(size):
        raise FleetError(
            f"{advice}: a {size}-byte packet is more than the broker's maximum packet size "
            f"({limits.maximum_packet_size} bytes)"
        )


def release(
    link: MqttLink, topics: Topics, device: str, key: Ed25519PrivateKey | None, timeout: float = 60.0
) -> Release:
    """Hand `device` back to its group: a signed `Release` on its own desired topic (retained,
    replacing the device's own desired document)."""
    document = Release(
        id=f"release-{uuid.uuid4().hex[:12]}", release=True, target=f"device:{device}", protocol=written_protocol()
    )
    if key is not None:
        document = sign(document, key, f"device:{device}")
    wait_acked([publish_retained(link, topics.desired(device), document.to_bytes())], link, timeout)
    return document


def follow(
    link: MqttLink, topics: Topics, devices: list[str], deployment_id: str, timeout: float
) -> dict[str, DeploymentDocument | Unreadable | None]:
    """Wait until every device's ``deployment`` record for `deployment_id` reaches a final state
    (or `timeout` seconds pass); {device: its latest record for that deployment, `Unreadable`
    when what it left there cannot be read, or None}."""
    records: dict[str, DeploymentDocument | Unreadable | None] = dict.fromkeys(devices)
    changed = threading.Condition()

    def on_record(message: Message) -> None:
        record = DeploymentDocument.read(message.payload, message.topic)
        device, _ = topics.split_device(message.topic)
        if device not in records:
            return
        with changed:
            if isinstance(record, Unreadable) or record.id == deployment_id:
                records[device] = record
            elif isinstance(records[device], Unreadable):
                records[device] = None  # another deployment's record replaced the junk
            changed.notify_all()

    filters = [topics.deployment(device) for device in devices]
    link.subscribe_many(filters, on_record)
    deadline = time.monotonic() + timeout
    try:
        with changed:
            while time.monotonic() < deadline and not all(
                isinstance(r, DeploymentDocument) and r.state in FINAL_STATES for r in records.values()
            ):
                changed.wait(0.2)
            return dict(records)
    finally:
        for topic_filter in filters:
            link.unsubscribe(topic_filter)
