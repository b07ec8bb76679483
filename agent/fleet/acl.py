"""`fleet acl`: a mosquitto ACL that limits each device to its own topics (docs/security.md).

A device's broker user name is its device id. It may write only its own status, telemetry,
events, deployment, deployments (the outbox's reports) and report topics and answers in the
reply space; it may read its own desired document and its group's, its commands and the
bundles. Operators may do everything under the topic root. Everyone else (anonymous clients
are refused by the broker config this file goes with) can do nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

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


def mosquitto_acl(devices: Sequence[tuple[str, str | None]], operators: Sequence[str], topics: Topics) -> str:
    """The ACL file's text: the broker settings it goes with (as comments), the operators' and
    one block per device."""
    root = topics.root
    lines = ["# edge-agent broker ACL (edge-agent fleet acl); docs/security.md", BROKER_SETTINGS]
    for operator in operators:
        lines += [
            f"# operator {operator}: everything under {root}/",
            f"user {operator}",
            f"topic readwrite {root}/#",
            "",
        ]
    for device, group in devices:
        lines += [f"# device {device}" + (f", group {group}" if group else ""), f"user {device}"]
        leaves = ("status", "telemetry", "events", "report", "deployments")
        lines += [f"topic write {topics.device(device, leaf)}" for leaf in leaves]
        lines += [f"topic write {topics.deployment(device)}", f"topic write {topics.replies}/#"]
        lines += [f"topic read {topics.desired(device)}", f"topic read {topics.command(device, '#')}"]
        if group:
            lines.append(f"topic read {topics.group_desired(group)}")
        lines += [f"topic read {root}/bundles/#", ""]
    return "\n".join(lines)
