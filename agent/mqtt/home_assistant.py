"""Home Assistant MQTT discovery (docs/integrations.md): the retained config documents that make
one edge device one Home Assistant device, built from what the agent already publishes.

Pure: `discovery` turns the device's identity and its cameras (with their lines and zones) into
`Entity` values, each a component (``sensor``, ``binary_sensor``, ``image``), an object id and the
config document Home Assistant reads from ``<prefix>/<component>/<device>/<object_id>/config``.
Every state is read with a value template from the existing topics: the retained ``status``
(fps, temperature, governor, version, problems; also the availability, whose last will is
``{"state": "offline"}``), ``telemetry`` (each camera, lines, zones, power, battery) and
``events`` (the last object event); each checked camera's "picture problem" (frozen, dark,
covered, moved, ...: docs/cameras.md "Camera health") from its telemetry. The one topic added
is each camera's annotated frame (`image_topic`, JPEG bytes, at a bounded rate). No control
entity: control is signed by the operator and Home Assistant cannot sign (docs/security.md).

Line crossings and zone entries are ``total_increasing``: they only grow until the signed
``reset-counts`` command sets them to zero, which Home Assistant's statistics read as a new
meter cycle. Zone occupancy (``now``) is a ``measurement``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from agent.governor.levels import BatteryLevel, ThermalLevel
from agent.mqtt.protocol import Topics

Component = Literal["sensor", "binary_sensor", "image"]

#: the governing level's possible values (the enum sensor's options): thermal's, then battery's
GOVERNOR_LEVELS = tuple(dict.fromkeys([*(t.value for t in ThermalLevel), *(b.value for b in BatteryLevel)]))


@dataclass(frozen=True)
class Camera:
    """A camera as discovery needs it: its name, its lines' and zones' names, the labels
    that get an "in view" sensor of their own (its ``classes`` filter; every label's count is
    also an attribute of the camera's "objects in view" sensor), and whether its picture's
    health is checked (``health.enabled``: a "picture problem" binary sensor)."""

    name: str
    lines: tuple[str, ...] = ()
    zones: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    health: bool = True


@dataclass(frozen=True)
class Identity:
    """Who the device is to Home Assistant: its id, board model and agent version."""

    device: str
    model: str
    sw_version: str
    manufacturer: str = "edge-agent"


@dataclass(frozen=True)
class Entity:
    """One discovered entity: `config` is the JSON document published retained on `topic`."""

    component: Component
    object_id: str
    topic: str
    config: dict[str, Any]

    def payload(self) -> bytes:
        return json.dumps(self.config, sort_keys=True).encode()


def slug(name: str) -> str:
    """`name` as an object id part: lower case letters, digits and ``_`` only."""
    return re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "x"


def image_topic(topics: Topics, device: str, camera: str) -> str:
    """Where the agent publishes `camera`'s annotated frame (JPEG, retained) for Home Assistant."""
    return topics.device(device, f"ha/{camera}/image")


def status_topic(prefix: str) -> str:
    """Home Assistant's birth and last will (``online`` / ``offline``)."""
    return f"{prefix}/status"


def _camera_value(camera: str, expression: str) -> str:
    """A template rendering `expression` (on ``p``, the camera's telemetry entry) for `camera`."""
    name = json.dumps(camera)
    return f"{{% for p in value_json.cameras if p.name == {name} %}}{{{{ {expression} }}}}{{% endfor %}}"


def _counted(kind: str, name: str, field: str) -> str:
    key = json.dumps(name)
    return (
        f"{{{{ value_json.analytics.{kind}[{key}][{json.dumps(field)}] "
        f"if value_json.analytics and {key} in value_json.analytics.{kind} else 'None' }}}}"
    )


def discovery(identity: Identity, topics: Topics, prefix: str, cameras: tuple[Camera, ...]) -> tuple[Entity, ...]:
    """Every entity of the device, in a stable order (device-wide first, then per camera)."""
    device = identity.device
    status, telemetry, events = topics.status(device), topics.telemetry(device), topics.events(device)
    common: dict[str, Any] = {
        "device": {
            "identifiers": [f"edge-agent_{device}"],
            "name": device,
            "model": identity.model,
            "manufacturer": identity.manufacturer,
            "sw_version": identity.sw_version,
        },
        "availability": [
            {
                "topic": status,
                "value_template": "{{ 'online' if value_json.state == 'online' else 'offline' }}",
                "payload_available": "online",
                "payload_not_available": "offline",
            }
        ],
    }
    entities: list[Entity] = []

    def add(component: Component, object_id: str, name: str, **keys: Any) -> None:
        oid = f"{slug(device)}_{object_id}"
        config = {**common, "name": name, "unique_id": f"edge-agent_{oid}", "object_id": oid, **keys}
        entities.append(Entity(component, object_id, f"{prefix}/{component}/{slug(device)}/{object_id}/config", config))

    add(
        "sensor",
        "temperature",
        "Temperature",
        state_topic=status,
        value_template="{{ value_json.temperature_c }}",
        device_class="temperature",
        unit_of_measurement="°C",
        state_class="measurement",
    )
    add(
        "sensor",
        "fps",
        "Frames per second",
        state_topic=status,
        value_template="{{ value_json.fps }}",
        unit_of_measurement="fps",
        state_class="measurement",
    )
    add(
        "sensor",
        "power",
        "Power",
        state_topic=telemetry,
        value_template="{{ value_json.sensors.power_w }}",
        device_class="power",
        unit_of_measurement="W",
        state_class="measurement",
    )
    add(
        "sensor",
        "battery",
        "Battery",
        state_topic=telemetry,
        value_template="{{ value_json.sensors.battery.percent if value_json.sensors.battery else 'None' }}",
        device_class="battery",
        unit_of_measurement="%",
        state_class="measurement",
    )
    add(
        "sensor",
        "governor",
        "Governor level",
        state_topic=status,
        value_template="{{ value_json.governor.level if value_json.governor else 'None' }}",
        device_class="enum",
        options=list(GOVERNOR_LEVELS),
    )
    add(
        "sensor",
        "version",
        "Active version",
        state_topic=status,
        value_template="{{ value_json.bundle.name ~ ' ' ~ value_json.bundle.version "
        "if value_json.bundle else 'none' }}",
    )
    problems = "[value_json.error, value_json.deployment_problem] | select | list + (value_json.warnings or [])"
    add(
        "binary_sensor",
        "problem",
        "Problem",
        state_topic=status,
        value_template=f"{{{{ 'ON' if ({problems}) else 'OFF' }}}}",
        device_class="problem",
        json_attributes_topic=status,
        json_attributes_template=f"{{% set p = {problems} %}}"
        "{{ {'problem': p[0] if p else none, 'problems': p | count} | tojson }}",
    )
    add(
        "sensor",
        "last_event",
        "Last object event",
        state_topic=events,
        value_template="{{ value_json.label ~ ' ' ~ value_json.type "
        "if value_json.label is defined else value_json.type }}",
        json_attributes_topic=events,
        json_attributes_template="{{ {'camera': value_json.camera, 'confidence': value_json.confidence, "
        "'object_id': value_json.object_id, 'ts': value_json.ts, 'pipeline': value_json.pipeline} | tojson }}",
    )
    for camera in cameras:
        c = slug(camera.name)
        add(
            "sensor",
            f"{c}_fps",
            f"{camera.name} FPS",
            state_topic=telemetry,
            value_template=_camera_value(camera.name, "p.fps"),
            unit_of_measurement="fps",
            state_class="measurement",
        )
        add(
            "sensor",
            f"{c}_status",
            f"{camera.name} status",
            state_topic=telemetry,
            value_template=_camera_value(camera.name, "p.source_status.state"),
        )
        add(
            "sensor",
            f"{c}_objects",
            f"{camera.name} objects in view",
            state_topic=telemetry,
            value_template=_camera_value(camera.name, "p.in_view.values() | sum"),
            unit_of_measurement="objects",
            state_class="measurement",
            json_attributes_topic=telemetry,
            json_attributes_template=_camera_value(camera.name, "p.in_view | tojson"),
        )
        for label in camera.labels:
            add(
                "sensor",
                f"{c}_{slug(label)}_in_view",
                f"{camera.name} {label} in view",
                state_topic=telemetry,
                value_template=_camera_value(camera.name, f"p.in_view.get({json.dumps(label)}, 0)"),
                unit_of_measurement="objects",
                state_class="measurement",
            )
        add(
            "image",
            f"{c}_image",
            f"{camera.name} frame",
            image_topic=image_topic(topics, device, camera.name),
            content_type="image/jpeg",
        )
        if camera.health:
            problems = "p.health.problems if p.health is defined and p.health else []"
            add(
                "binary_sensor",
                f"{c}_picture_problem",
                f"{camera.name} picture problem",
                state_topic=telemetry,
                value_template=_camera_value(camera.name, f"'ON' if ({problems}) else 'OFF'"),
                device_class="problem",
                json_attributes_topic=telemetry,
                json_attributes_template=_camera_value(camera.name, f"{{'problems': {problems}}} | tojson"),
            )
        for line in camera.lines:
            for direction in ("in", "out"):
                add(
                    "sensor",
                    f"line_{slug(line)}_{direction}",
                    f"{line} crossings {direction}",
                    state_topic=telemetry,
                    value_template=_counted("lines", line, direction),
                    unit_of_measurement="crossings",
                    state_class="total_increasing",
                )
        for zone in camera.zones:
            add(
                "sensor",
                f"zone_{slug(zone)}_now",
                f"{zone} occupancy",
                state_topic=telemetry,
                value_template=_counted("zones", zone, "now"),
                unit_of_measurement="objects",
                state_class="measurement",
            )
            add(
                "sensor",
                f"zone_{slug(zone)}_total",
                f"{zone} entries",
                state_topic=telemetry,
                value_template=_counted("zones", zone, "total"),
                unit_of_measurement="entries",
                state_class="total_increasing",
            )
    return tuple(entities)
