"""The fleet's state as the devices left it on the broker: status, deployment and telemetry per
device, the groups' staged rollouts, the rows of `fleet status`, and the members of a group."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from agent.fleet.client import FleetError, collect, parse_json
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import Desired, ProtocolError, Topics


def fleet_state(link: MqttLink, topics: Topics, wait: float = 2.0) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every device that left a status, deployment or telemetry message: ({device: {leaf:
    document}}, the topics whose document was not a JSON object, skipped)."""
    leaves = ("status", "deployment", "telemetry")
    messages = collect(link, [f"{topics.root}/+/{leaf}" for leaf in leaves], wait)
    devices: dict[str, dict[str, Any]] = {}
    malformed = []
    for topic, payload in sorted(messages.items()):
        document = parse_json(payload)
        if not isinstance(document, dict):
            malformed.append(topic)
            continue
        device, leaf = topics.split_device(topic)
        devices.setdefault(device, {})[leaf] = document
    return dict(sorted(devices.items())), malformed


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


def status_rows(
    devices: dict[str, dict[str, Any]], rollouts: Mapping[str, Desired] | None = None, now: float | None = None
) -> list[dict[str, Any]]:
    """One flat row per device for the `fleet status` table; `rollouts` ({group: desired
    document}) give each member its wave."""
    rollouts, now = rollouts or {}, time.time() if now is None else now
    rows = []
    for device, parts in devices.items():
        status = parts.get("status") or {}
        deployment = parts.get("deployment") or {}
        telemetry = parts.get("telemetry") or {}
        bundle = status.get("bundle") or {}
        if not bundle and status.get("state") == "offline" and deployment.get("state") == "SUCCEEDED":
            bundle = deployment  # the last will names no bundle: the last deployment that succeeded does
        progress = deployment.get("progress") or {}
        group = str(status.get("group"))
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
                "wave": wave_text(rollouts[group], device, now)
                if (group := str(status.get("group"))) in rollouts
                else None,
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
        for device, parts in fleet_state(link, topics, wait)[0].items()
        if (parts.get("status") or {}).get("group") == name
    ]
    if not members:
        raise FleetError(f"no device reported being in group {name!r}")
    return members
