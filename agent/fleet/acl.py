"""`fleet acl`: a mosquitto ACL that limits each device to its own topics (docs/security.md).

A device's broker user name is its device id. It may write only its own status, telemetry,
events, deployment, deployments (the outbox's reports) and report topics and answers in the
reply space; it may read its own desired document and its group's, its commands and the
bundles. Operators may do everything under the topic root. Everyone else (anonymous clients
are refused by the broker config this file goes with) can do nothing.

Home Assistant (`home_assistant`, the discovery prefix; ``fleet acl --home-assistant``): the
operator's side cannot see which devices enable ``integrations.home_assistant``, so the rules are
asked for once for the fleet, and a device that does not enable it just never uses them. A device
may then write exactly what `agent.daemon.ha_feed` publishes: its discovery configs,
``<prefix>/<component>/<node>/<object_id>/config`` where ``<node>`` is the device id's
`agent.mqtt.home_assistant.slug` (so one device cannot write another's entities; two ids with the
same slug, ``cam-1`` and ``cam_1``, would share them), and its cameras' frames,
``<root>/<device>/ha/<camera>/image``; and read Home Assistant's birth, ``<prefix>/status``.
Without them the broker drops every discovery publish (MQTT 5 answers each with "not authorized",
which the device shows as a problem: `agent.mqtt.link`). Home Assistant's own broker users
(`home_assistant_users`) may read the devices' status, telemetry, events and frames and do
everything under the prefix (its birth, its discovery subscription).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from agent.mqtt.home_assistant import slug, status_topic
from agent.mqtt.protocol import Topics

_WORD = re.compile(r"^[A-Za-z0-9_.-]+$")

BROKER_SETTINGS = """\
# mosquitto.conf, with this file:
#   allow_anonymous false
#   password_file /etc/mosquitto/passwd    # mosquitto_passwd -c /etc/mosquitto/passwd <device id>
#   acl_file /etc/mosquitto/edge-agent.acl
#   use_username_as_clientid true          # nobody can take over a device's session with its client id
# (with client certificates instead of passwords: require_certificate true, use_identity_as_username true)
"""


def parse_devices(lines: Iterable[str]) -> list[tuple[str, str | None]]:
    """``ID[:GROUP]`` lines (blank lines and ``#`` comments skipped) into (device, group) pairs;
    `ValueError` naming the first bad line."""
    devices = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        device, _, group = text.partition(":")
        if not _WORD.match(device) or (group and not _WORD.match(group)):
            raise ValueError(
                f"device line {number} ({text!r}): expected ID[:GROUP] of letters, digits, '_', '-' and '.'"
            )
        devices.append((device, group or None))
    return devices


def mosquitto_acl(
    devices: Sequence[tuple[str, str | None]],
    operators: Sequence[str],
    topics: Topics,
    home_assistant: str | None = None,
    home_assistant_users: Sequence[str] = (),
) -> str:
    """The ACL file's text: the broker settings it goes with (as comments), the operators', Home
    Assistant's (with a discovery prefix `home_assistant`) and one block per device."""
    root = topics.root
    lines = ["# edge-agent broker ACL (edge-agent fleet acl); docs/security.md", BROKER_SETTINGS]
    for operator in operators:
        lines += [
            f"# operator {operator}: everything under {root}/",
            f"user {operator}",
            f"topic readwrite {root}/#",
            "",
        ]
    if home_assistant is not None:
        for user in home_assistant_users:
            lines += [
                f"# home assistant {user}: discovery under {home_assistant}/, the devices' states",
                f"user {user}",
            ]
            lines.append(f"topic readwrite {home_assistant}/#")
            lines += [f"topic read {topics.device('+', leaf)}" for leaf in ("status", "telemetry", "events", "ha/#")]
            lines.append("")
    for device, group in devices:
        lines += [f"# device {device}" + (f", group {group}" if group else ""), f"user {device}"]
        leaves = ("status", "telemetry", "events", "report", "deployments")
        lines += [f"topic write {topics.device(device, leaf)}" for leaf in leaves]
        lines += [f"topic write {topics.deployment(device)}", f"topic write {topics.replies}/#"]
        lines += [f"topic read {topics.desired(device)}", f"topic read {topics.command(device, '#')}"]
        if group:
            lines.append(f"topic read {topics.group_desired(group)}")
        lines.append(f"topic read {root}/bundles/#")
        if home_assistant is not None:
            lines += home_assistant_rules(device, topics, home_assistant)
        lines.append("")
    return "\n".join(lines)


def home_assistant_rules(device: str, topics: Topics, prefix: str) -> list[str]:
    """What `device`'s Home Assistant feed needs (see the module text), as ACL lines."""
    return [
        f"# home assistant discovery under {prefix}/ (integrations.home_assistant)",
        f"topic write {prefix}/+/{slug(device)}/+/config",
        f"topic write {topics.device(device, 'ha/+/image')}",
        f"topic read {status_topic(prefix)}",
    ]
