"""The fleet's state as the devices left it on the broker: status, deployment and telemetry per
device, read once into their typed documents (agent/mqtt/device_documents.py), the groups'
staged rollouts, the rows of `fleet status`, and the members of a group.

Each document is read by its model's `read` (`fleet status`, the rollout watch and `fleet push
--wait` alike): a payload that is not the document its topic carries comes back as `Unreadable`
and is shown as such, never raised.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from agent.bundles.record import QualityRecord, ShadowRecord, State
from agent.fleet.client import FleetError, collect
from agent.mqtt.device_documents import (
    DeploymentDocument,
    DeviceDocument,
    StatusDocument,
    TelemetryDocument,
    Unreadable,
)
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import Desired, ProtocolError, Topics

#: the device topics `fleet status` reads
LEAVES = ("status", "deployment", "telemetry")


@dataclass(frozen=True)
class DeviceReports:
    """What one device left on the broker: each document, `Unreadable` when its payload is not
    one, None when there is none."""

    status: StatusDocument | Unreadable | None = None
    deployment: DeploymentDocument | Unreadable | None = None
    telemetry: TelemetryDocument | Unreadable | None = None

    @property
    def group(self) -> str | None:
        """The group the device's status names (None: none, or no readable status)."""
        return self.status.group if isinstance(self.status, StatusDocument) else None

    @property
    def unreadable(self) -> tuple[Unreadable, ...]:
        return tuple(d for d in (self.status, self.deployment, self.telemetry) if isinstance(d, Unreadable))

    def documents(self) -> dict[str, DeviceDocument]:
        """The readable documents by leaf."""
        found = {"status": self.status, "deployment": self.deployment, "telemetry": self.telemetry}
        return {leaf: document for leaf, document in found.items() if isinstance(document, DeviceDocument)}


@dataclass(frozen=True)
class StatusRow:
    """One device in the `fleet status` table, as text (None: unknown, printed ``-``); the
    state or deployment of a document that cannot be read is ``unreadable``."""

    device: str
    state: str
    group: str | None
    bundle: str | None
    deployment: str | None
    wave: str | None
    fps: float | None
    temperature_c: float | None
    quality: str | None = None
    version: str | None = None


def fleet_state(link: MqttLink, topics: Topics, wait: float = 2.0) -> dict[str, DeviceReports]:
    """Every device that left a status, deployment or telemetry message, by device id, each
    document read into its model (agent/mqtt/device_documents.py: the one reader)."""
    messages = collect(link, [f"{topics.root}/+/{leaf}" for leaf in LEAVES], wait)
    found: dict[str, DeviceReports] = {}
    for topic, payload in sorted(messages.items()):
        device, leaf = topics.split_device(topic)
        reports = found.get(device, DeviceReports())
        if leaf == "status":
            found[device] = replace(reports, status=StatusDocument.read(payload, topic))
        elif leaf == "deployment":
            found[device] = replace(reports, deployment=DeploymentDocument.read(payload, topic))
        elif leaf == "telemetry":
            found[device] = replace(reports, telemetry=TelemetryDocument.read(payload, topic))
    return dict(sorted(found.items()))


def group_rollouts(link: MqttLink, topics: Topics, wait: float = 2.0) -> dict[str, Desired]:
    """{group: its desired document} for every group whose document is a staged rollout."""
    rollouts = {}
    for topic, payload in collect(link, [topics.group_desired("+")], wait).items():
        try:
            desired = Desired.parse(payload, topic)
        except ProtocolError:
            continue  # the devices refuse it too, and say so in their status
        if desired.rollout is not None:
            rollouts[topic.split("/")[-2]] = desired
    return rollouts


def wave_text(desired: Desired, device: str, now: float) -> str:
    """``2/4 open``, ``3/4 at 14:05`` or ``2/4 halted``: the device in its group's rollout."""
    rollout = desired.rollout
    assert rollout is not None
    wave = rollout.wave_of(desired.id, device)
    where = f"{wave + 1}/{len(rollout.waves)}"
    if rollout.halted is not None:
        return f"{where} halted"
    opens = rollout.opens_at(wave)
    return f"{where} open" if opens <= now else f"{where} at {time.strftime('%H:%M', time.localtime(opens))}"


def deployment_text(record: DeploymentDocument) -> str:
    """``SUCCEEDED``, ``DOWNLOADING 75%``, ``REJECTED (PARITY_FAILED)``."""
    text = str(record.state)
    progress = record.progress
    if record.state == State.DOWNLOADING and progress is not None and progress.chunks_total:
        text = f"{text} {100 * progress.chunks_done // progress.chunks_total}%"
    return f"{text} ({record.error.code})" if record.error else text


class Judged(Protocol):
    """A deployment record or document: what its version was judged to see."""

    @property
    def shadow(self) -> ShadowRecord | None: ...

    @property
    def quality(self) -> QualityRecord | None: ...


def quality_text(record: Judged) -> str | None:
    """What the version was judged to see, the worst camera's number against its threshold:
    ``shadow agrees 0.91``, ``shadow disagrees 0.31<0.8 (report)``, ``shadow quiet``, ``shadow
    running 0.93 so far`` (a shadow in progress), then ``probation kept 0.97``, ``probation
    blind 0.05<0.5``, with the agreement with the previous version where probation compared
    them (``probation blind 1.02, agreement 0.04<0.5``); None before either judged it."""
    parts = []
    if (shadow := record.shadow) is not None:
        least = min((c.agreement for c in shadow.cameras), default=None)
        text = f"shadow {shadow.outcome}"
        if least is not None and shadow.outcome != "quiet":
            text += f" {least:.2f}" + (f"<{shadow.min_agreement:g}" if least < shadow.min_agreement else "")
        text += " so far" if shadow.outcome == "running" else ""
        parts.append(text + (" (report)" if shadow.mode == "report" else ""))
    if (quality := record.quality) is not None:
        least = min((c.ratio for c in quality.cameras if c.ratio is not None), default=None)
        text = f"probation {quality.outcome}"
        if least is not None:
            text += f" {least:.2f}" + (f"<{quality.min_ratio:g}" if least < quality.min_ratio else "")
        agreement = quality.agreement
        lowest = min((c.agreement for c in agreement.cameras), default=None) if agreement else None
        if agreement is not None and lowest is not None and agreement.outcome != "quiet":
            text += f", agreement {lowest:.2f}" + (
                f"<{agreement.min_agreement:g}" if agreement.outcome == "disagrees" else ""
            )
        parts.append(text)
    return "; ".join(parts) or None


def status_rows(
    devices: Mapping[str, DeviceReports], rollouts: Mapping[str, Desired] | None = None, now: float | None = None
) -> list[StatusRow]:
    """One row per device for the `fleet status` table; `rollouts` ({group: desired
    document}) give each member its wave."""
    rollouts, now = rollouts or {}, time.time() if now is None else now
    rows = []
    for device, parts in devices.items():
        status = parts.status if isinstance(parts.status, StatusDocument) else None
        record = parts.deployment if isinstance(parts.deployment, DeploymentDocument) else None
        telemetry = parts.telemetry if isinstance(parts.telemetry, TelemetryDocument) else None
        bundle = f"{status.bundle.name} {status.bundle.version}" if status and status.bundle else None
        if bundle is None and status and status.state == "offline" and record and record.state == State.SUCCEEDED:
            bundle = f"{record.name} {record.version}"  # the last will names no bundle: the last success does
        group = parts.group
        fps = telemetry.fps if telemetry and telemetry.fps is not None else status.fps if status else None
        rows.append(
            StatusRow(
                device=device,
                state=status.state if status else "unreadable" if isinstance(parts.status, Unreadable) else "?",
                group=group,
                bundle=bundle,
                deployment=deployment_text(record)
                if record
                else "unreadable"
                if isinstance(parts.deployment, Unreadable)
                else None,
                wave=wave_text(rollouts[group], device, now) if group is not None and group in rollouts else None,
                fps=fps,
                temperature_c=status.temperature_c if status else None,
                quality=quality_text(record) if record else None,
                version=status.agent_version if status else None,
            )
        )
    return rows


def targets(link: MqttLink, topics: Topics, target: str, wait: float = 2.0) -> list[str]:
    """The device ids a target names: itself, or every device whose status names the group."""
    topics.target_desired(target)  # checks the form
    kind, _, name = target.partition(":")
    if kind == "device":
        return [name]
    members = [device for device, parts in fleet_state(link, topics, wait).items() if parts.group == name]
    if not members:
        raise FleetError(f"no device reported being in group {name!r}")
    return members
