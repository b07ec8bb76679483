"""The discovery configs (agent/mqtt/home_assistant.py) as a case table: each entity's component,
topic and the keys Home Assistant reads; the templates themselves run in a real Home Assistant
(tests/e2e/test_home_assistant.py)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.mqtt.home_assistant import GOVERNOR_LEVELS, Camera, Identity, discovery, image_topic, slug, status_topic
from agent.mqtt.protocol import Topics

IDENTITY = Identity("cam-7", "Raspberry Pi 5", "1.2.3")
TOPICS = Topics("edge")
CAMERAS = (Camera("Front Door", lines=("gate",), zones=("porch",), labels=("person",)),)
ENTITIES = {e.object_id: e for e in discovery(IDENTITY, TOPICS, "homeassistant", CAMERAS)}

STATUS, TELEMETRY, EVENTS = "edge/cam-7/status", "edge/cam-7/telemetry", "edge/cam-7/events"
CASES: list[tuple[str, str, dict[str, Any]]] = [
    (
        "temperature",
        "sensor",
        {
            "state_topic": STATUS,
            "device_class": "temperature",
            "unit_of_measurement": "°C",
            "state_class": "measurement",
        },
    ),
    ("fps", "sensor", {"state_topic": STATUS, "unit_of_measurement": "fps", "state_class": "measurement"}),
    (
        "power",
        "sensor",
        {"state_topic": TELEMETRY, "device_class": "power", "unit_of_measurement": "W", "state_class": "measurement"},
    ),
    (
        "battery",
        "sensor",
        {"state_topic": TELEMETRY, "device_class": "battery", "unit_of_measurement": "%", "state_class": "measurement"},
    ),
    (
        "governor",
        "sensor",
        {"state_topic": STATUS, "device_class": "enum", "options": ["NORMAL", "WARM", "HOT", "CRITICAL", "OK", "LOW"]},
    ),
    ("version", "sensor", {"state_topic": STATUS}),
    ("problem", "binary_sensor", {"state_topic": STATUS, "device_class": "problem", "json_attributes_topic": STATUS}),
    ("last_event", "sensor", {"state_topic": EVENTS, "json_attributes_topic": EVENTS}),
    (
        "front_door_fps",
        "sensor",
        {"state_topic": TELEMETRY, "unit_of_measurement": "fps", "state_class": "measurement"},
    ),
    ("front_door_status", "sensor", {"state_topic": TELEMETRY}),
    (
        "front_door_objects",
        "sensor",
        {
            "state_topic": TELEMETRY,
            "unit_of_measurement": "objects",
            "state_class": "measurement",
            "json_attributes_topic": TELEMETRY,
        },
    ),
    (
        "front_door_person_in_view",
        "sensor",
        {"state_topic": TELEMETRY, "unit_of_measurement": "objects", "state_class": "measurement"},
    ),
    (
        "front_door_picture_problem",
        "binary_sensor",
        {"state_topic": TELEMETRY, "device_class": "problem", "json_attributes_topic": TELEMETRY},
    ),
    ("front_door_image", "image", {"image_topic": "edge/cam-7/ha/Front Door/image", "content_type": "image/jpeg"}),
    (
        "line_gate_in",
        "sensor",
        {"state_topic": TELEMETRY, "unit_of_measurement": "crossings", "state_class": "total_increasing"},
    ),
    (
        "line_gate_out",
        "sensor",
        {"state_topic": TELEMETRY, "unit_of_measurement": "crossings", "state_class": "total_increasing"},
    ),
    (
        "zone_porch_now",
        "sensor",
        {"state_topic": TELEMETRY, "unit_of_measurement": "objects", "state_class": "measurement"},
    ),
    (
        "zone_porch_total",
        "sensor",
        {"state_topic": TELEMETRY, "unit_of_measurement": "entries", "state_class": "total_increasing"},
    ),
]


def test_every_entity_is_in_the_table() -> None:
    assert sorted(ENTITIES) == sorted(case[0] for case in CASES)


@pytest.mark.parametrize(("object_id", "component", "keys"), CASES, ids=[c[0] for c in CASES])
def test_entity_config(object_id: str, component: str, keys: dict[str, Any]) -> None:
    entity = ENTITIES[object_id]
    assert entity.component == component
    assert entity.topic == f"homeassistant/{component}/cam_7/{object_id}/config"
    assert {k: entity.config.get(k) for k in keys} == keys
    assert entity.config["unique_id"] == f"edge-agent_cam_7_{object_id}"
    for absent in {"device_class", "unit_of_measurement", "state_class"} - set(keys):
        assert absent not in entity.config, f"{object_id} has {absent}"


def test_one_device_with_its_identity_and_the_last_will_as_availability() -> None:
    devices = {str(e.config["device"]) for e in ENTITIES.values()}
    assert len(devices) == 1
    entity = ENTITIES["fps"]
    assert entity.config["device"] == {
        "identifiers": ["edge-agent_cam-7"],
        "name": "cam-7",
        "model": "Raspberry Pi 5",
        "manufacturer": "edge-agent",
        "sw_version": "1.2.3",
    }
    (availability,) = entity.config["availability"]
    assert availability["topic"] == STATUS
    assert (availability["payload_available"], availability["payload_not_available"]) == ("online", "offline")


def test_no_control_entities() -> None:
    assert {e.component for e in ENTITIES.values()} <= {"sensor", "binary_sensor", "image"}
    assert not any("command_topic" in e.config for e in ENTITIES.values())


def test_templates_name_the_camera_line_and_zone() -> None:
    assert '"Front Door"' in ENTITIES["front_door_fps"].config["value_template"]
    assert '"gate"' in ENTITIES["line_gate_out"].config["value_template"]
    assert '"out"' in ENTITIES["line_gate_out"].config["value_template"]
    assert '"total"' in ENTITIES["zone_porch_total"].config["value_template"]
    assert '"now"' in ENTITIES["zone_porch_now"].config["value_template"]


def test_prefix_topics_and_slugs() -> None:
    other = discovery(IDENTITY, Topics("site"), "ha", ())
    assert {e.topic.split("/")[0] for e in other} == {"ha"}
    assert {e.config["state_topic"] for e in other if "state_topic" in e.config} <= {
        "site/cam-7/status",
        "site/cam-7/telemetry",
        "site/cam-7/events",
    }
    assert status_topic("ha") == "ha/status"
    assert image_topic(Topics("site"), "d", "c") == "site/d/ha/c/image"
    assert slug("Front Door-2") == "front_door_2"
    assert GOVERNOR_LEVELS == ("NORMAL", "WARM", "HOT", "CRITICAL", "OK", "LOW")


def test_a_camera_s_picture_problem_reads_its_health_and_only_while_it_is_checked() -> None:
    template = ENTITIES["front_door_picture_problem"].config["value_template"]
    assert '"Front Door"' in template and "p.health.problems" in template and "'ON'" in template
    unchecked = discovery(IDENTITY, TOPICS, "homeassistant", (Camera("Front Door", health=False),))
    assert "front_door_picture_problem" not in {e.object_id for e in unchecked}
