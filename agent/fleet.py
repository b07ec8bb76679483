"""The operator's side of the MQTT protocol: push bundles, read the fleet, roll back, clean up.

The broker is the only server: `push` leaves the chunks, their index and the desired document
retained on it, so a device that is offline now catches up when it connects.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from pydantic import ValidationError

from agent.config import MqttSection
from agent.errors import BundleError
from agent.manifest import Manifest
from agent.mqtt_link import MqttLink
from agent.protocol import ChunkIndex, Desired, ProtocolError, Topics
from agent.store import FINAL_STATES

MAX_MANIFEST_BYTES = 1 << 20


class FleetError(Exception):
    """What went wrong talking to the fleet, in words for the operator."""


def connect(settings: MqttSection, timeout: float = 10.0) -> MqttLink:
    """A connected link for one operator command; fails at the first refused attempt."""
    link = MqttLink(settings, f"edge-agent-fleet-{uuid.uuid4().hex[:8]}", max_inflight=64).start()
    deadline = time.monotonic() + timeout
    while not link.wait_connected(0.1):
        if link.last_error is not None or time.monotonic() > deadline:
            link.stop()
            raise FleetError(f"cannot reach the broker {settings.broker}: {link.last_error or 'no answer'}")
    return link


def bundle_manifest(bundle: Path) -> Manifest:
    """Read the manifest out of a bundle file without unpacking the rest."""
    try:
        with tarfile.open(bundle, "r:") as tar:
            member = tar.getmember("manifest.json")
            if not member.isfile() or member.size > MAX_MANIFEST_BYTES:
                raise BundleError("MANIFEST_INVALID", f"{bundle}: manifest.json is not a small regular file")
            raw = tar.extractfile(member)
            assert raw is not None
            return Manifest.model_validate_json(raw.read())
    except (OSError, tarfile.TarError, KeyError) as exc:
        raise BundleError("NOT_A_BUNDLE", f"{bundle} is not a bundle (a tar with manifest.json): {exc}") from exc
    except ValidationError as exc:
        raise BundleError("MANIFEST_INVALID", f"{bundle}: manifest.json is not valid: {exc}") from exc


def _wait_all(infos: list[mqtt.MQTTMessageInfo], link: MqttLink, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for info in infos:
        while not info.is_published():
            if not link.connected:
                raise FleetError("the broker connection was lost during the push; run it again")
            if time.monotonic() > deadline:
                raise FleetError(f"the broker did not acknowledge the push within {timeout:.0f} s")
            info.wait_for_publish(0.2)


def _publish(link: MqttLink, topic: str, payload: bytes, retain: bool = True) -> mqtt.MQTTMessageInfo:
    info = link.publish(topic, payload, qos=1, retain=retain)
    if info is None:
        raise FleetError("the broker connection was lost during the push; run it again")
    return info


def push(
    link: MqttLink,
    topics: Topics,
    bundle: Path,
    target: str,
    *,
    chunk_size: int,
    url: str | None = None,
    progress: Callable[[int], None] = lambda n: None,
    timeout: float = 600.0,
) -> Desired:
    """Publish the bundle's chunks (unless `url` serves it) and index, then, once the broker has
    acknowledged them, the desired document for `target` (``device:ID`` or ``group:NAME``); all
    retained, QoS 1. `progress` gets the bytes acknowledged so far."""
    desired_topic = topics.target_desired(target)
    manifest = bundle_manifest(bundle)
    data = memoryview(bundle.read_bytes())
    sha256 = hashlib.sha256(data).hexdigest()  # names the chunk topics, so it comes first
    chunks, infos = [], []
    for start in range(0, len(data), chunk_size):
        piece = data[start : start + chunk_size]
        chunks.append(hashlib.sha256(piece).hexdigest())  # hashing overlaps paho sending the previous chunk
        if url is None:
            infos.append(_publish(link, topics.chunk(sha256, len(chunks) - 1), piece.tobytes()))
    created = datetime.now(timezone.utc).replace(microsecond=0)
    index = ChunkIndex(sha256=sha256, size=len(data), chunk_size=chunk_size, chunks=chunks, created=created)
    infos.append(_publish(link, topics.index(sha256), index.to_bytes()))
    done = 0
    for i, info in enumerate(infos[:-1]):
        _wait_all([info], link, timeout)
        done += index.span(i)[1]
        progress(done)
    _wait_all(infos[-1:], link, timeout)
    desired = Desired(
        id=f"{manifest.name}-{manifest.version}-{uuid.uuid4().hex[:8]}",
        name=manifest.name,
        version=manifest.version,
        sha256=index.sha256,
        size=index.size,
        chunk_size=chunk_size,
        chunks=len(index.chunks),
        source="url" if url else "mqtt",
        url=url,
        created=created.isoformat(),
    )
    _wait_all([_publish(link, desired_topic, desired.to_bytes())], link, timeout)
    return desired


@dataclass
class Retained:
    """What a subscription collected: topic -> payload (the retained ones arrive first)."""

    messages: dict[str, bytes] = field(default_factory=dict)
    last: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.messages[message.topic] = bytes(message.payload)
            self.last = time.monotonic()


def collect(link: MqttLink, filters: list[str], wait: float, quiet: float = 0.3) -> dict[str, bytes]:
    """Subscribe to `filters` and gather messages until `quiet` seconds pass without one (at most
    `wait` seconds); empty payloads (cleared retained topics) are left out."""
    retained = Retained()
    link.subscribe_many(filters, retained.add)
    start = retained.last = time.monotonic()
    while time.monotonic() - start < wait and time.monotonic() - retained.last < quiet:
        time.sleep(0.05)
    for topic_filter in filters:
        link.unsubscribe(topic_filter)
    with retained.lock:
        return {t: p for t, p in retained.messages.items() if p}


def _json(payload: bytes | bytearray) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        return None


def fleet_state(link: MqttLink, topics: Topics, wait: float = 2.0) -> dict[str, dict[str, Any]]:
    """Every device that left a status, deployment or telemetry message: {device: {...}}."""
    leaves = ("status", "deployment", "telemetry")
    messages = collect(link, [f"{topics.root}/+/{leaf}" for leaf in leaves], wait)
    devices: dict[str, dict[str, Any]] = {}
    for topic, payload in messages.items():
        device, leaf = topics.split_device(topic)
        devices.setdefault(device, {})[leaf] = _json(payload)
    return dict(sorted(devices.items()))


def status_rows(devices: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per device for the `fleet status` table."""
    rows = []
    for device, parts in devices.items():
        status = parts.get("status") or {}
        deployment = parts.get("deployment") or {}
        telemetry = parts.get("telemetry") or {}
        bundle = status.get("bundle") or {}
        progress = deployment.get("progress") or {}
        state = deployment.get("state")
        if state == "DOWNLOADING" and progress.get("chunks_total"):
            state = f"DOWNLOADING {100 * progress['chunks_done'] // progress['chunks_total']}%"
        if deployment.get("error"):
            state = f"{state} ({deployment['error'].get('code')})"
        rows.append(
            {
                "device": device,
                "state": status.get("state", "?"),
                "group": status.get("group"),
                "bundle": f"{bundle.get('name')} {bundle.get('version')}" if bundle else None,
                "deployment": state,
                "fps": telemetry.get("fps", status.get("fps")),
                "temperature_c": status.get("temperature_c"),
            }
        )
    return rows


def targets(link: MqttLink, topics: Topics, target: str, wait: float = 2.0) -> list[str]:
    """The device ids a target names: itself, or every device whose status names the group."""
    topics.target_desired(target)  # checks the form
    kind, _, name = target.partition(":")
    if kind == "device":
        return [name]
    members = [
        device
        for device, parts in fleet_state(link, topics, wait).items()
        if (parts.get("status") or {}).get("group") == name
    ]
    if not members:
        raise FleetError(f"no device reported being in group {name!r}")
    return members


def command(
    link: MqttLink, topics: Topics, devices: list[str], name: str, payload: bytes = b"", timeout: float = 30.0
) -> dict[str, tuple[bytes, str] | None]:
    """Send command `name` to each device (MQTT 5 request/response); {device: (answer, content
    type), or None when it did not answer within `timeout` seconds}."""
    reply_topic = f"{topics.root}/fleet/{uuid.uuid4().hex}/response"
    answers: dict[str, tuple[bytes, str] | None] = dict.fromkeys(devices)
    arrived = threading.Condition()

    def on_answer(message: mqtt.MQTTMessage) -> None:
        device = bytes(getattr(message.properties, "CorrelationData", b"") or b"").decode(errors="replace")
        with arrived:
            if device in answers:
                answers[device] = (bytes(message.payload), getattr(message.properties, "ContentType", ""))
                arrived.notify_all()

    link.subscribe(reply_topic, on_answer)
    try:
        time.sleep(0.1)  # let the SUBACK land before the first answer can
        for device in devices:
            properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            properties.ResponseTopic = reply_topic
            properties.CorrelationData = device.encode()
            if link.publish(topics.command(device, name), payload, qos=1, properties=properties) is None:
                raise FleetError("the broker connection was lost; run it again")
        deadline = time.monotonic() + timeout
        with arrived:
            while any(v is None for v in answers.values()) and time.monotonic() < deadline:
                arrived.wait(0.2)
    finally:
        link.unsubscribe(reply_topic)
    return answers


def unreferenced_bundles(
    link: MqttLink, topics: Topics, wait: float = 2.0, min_age_s: float = 600.0
) -> dict[str, ChunkIndex]:
    """Bundles whose chunks are on the broker but that no desired document names, pushed more
    than `min_age_s` seconds ago (a push in progress has its chunks out before its desired
    document: a younger index may belong to one)."""
    root = topics.root
    messages = collect(link, [f"{root}/bundles/+/index", f"{root}/+/desired", f"{root}/groups/+/desired"], wait)
    referenced, indexes = set(), {}
    for topic, payload in messages.items():
        try:
            if topic.endswith("/index"):
                index = ChunkIndex.parse(payload, topic)
                indexes[index.sha256] = index
            else:
                referenced.add(Desired.parse(payload, topic).sha256)
        except ProtocolError:
            continue  # not ours to judge; a device reports it
    now = datetime.now(timezone.utc)

    def old_enough(index: ChunkIndex) -> bool:
        created = index.created
        if created is None:
            return True
        if created.tzinfo is None:
            created = created.replace(tzinfo=timezone.utc)
        return (now - created).total_seconds() >= min_age_s

    return {sha: index for sha, index in indexes.items() if sha not in referenced and old_enough(index)}


def clear_bundle(link: MqttLink, topics: Topics, index: ChunkIndex, timeout: float = 60.0) -> None:
    """Remove a bundle's retained chunks and index from the broker."""
    infos = [_publish(link, topics.chunk(index.sha256, i), b"") for i in range(len(index.chunks))]
    infos.append(_publish(link, topics.index(index.sha256), b""))
    _wait_all(infos, link, timeout)


def follow(
    link: MqttLink, topics: Topics, devices: list[str], deployment_id: str, timeout: float
) -> dict[str, dict[str, Any] | None]:
    """Wait until every device's ``deployment`` record for `deployment_id` reaches a final state
    (or `timeout` seconds pass); {device: its latest record for that deployment, or None}."""
    records: dict[str, dict[str, Any] | None] = dict.fromkeys(devices)
    changed = threading.Condition()

    def on_record(message: mqtt.MQTTMessage) -> None:
        record = _json(message.payload)
        device, _ = topics.split_device(message.topic)
        if isinstance(record, dict) and record.get("id") == deployment_id and device in records:
            with changed:
                records[device] = record
                changed.notify_all()

    filters = [topics.deployment(device) for device in devices]
    link.subscribe_many(filters, on_record)
    deadline = time.monotonic() + timeout
    try:
        with changed:
            while time.monotonic() < deadline and not all(
                r is not None and r.get("state") in FINAL_STATES for r in records.values()
            ):
                changed.wait(0.2)
            return dict(records)
    finally:
        for topic_filter in filters:
            link.unsubscribe(topic_filter)
