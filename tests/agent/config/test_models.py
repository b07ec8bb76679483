"""`agent.config.models`: broker URLs, the status page's settings, line and zone names unique over the
cameras, the documented examples valid, the published schema current."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from testkit import REPO

from agent.config.loading import schema_json
from agent.config.models import AgentConfig, MqttSection, StatusPageSection


@pytest.mark.parametrize(
    ("url", "host", "port", "tls"),
    [
        ("mqtt://broker", "broker", 1883, False),
        ("mqtts://broker", "broker", 8883, True),
        ("mqtt://10.0.0.2:11883", "10.0.0.2", 11883, False),
    ],
)
def test_broker_urls(url: str, host: str, port: int, tls: bool) -> None:
    settings = MqttSection(broker=url)
    assert (settings.host, settings.port, settings.uses_tls) == (host, port, tls)


def test_documented_example_configs_are_valid(tmp_path: Path) -> None:
    text = (REPO / "docs" / "configuration.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    assert len(blocks) >= 3, "Jetson, Raspberry Pi and x86 examples"
    for block in blocks:
        AgentConfig.model_validate(yaml.safe_load(block))


@pytest.mark.schema_docs
def test_config_schema_in_docs_is_current() -> None:
    assert (REPO / "docs" / "agent-config.schema.json").read_text() == schema_json(), (
        "run: python -m agent.config > docs/agent-config.schema.json"
    )


def config(**pipeline: Any) -> AgentConfig:
    return AgentConfig.model_validate({"cameras": [{"source": "synthetic", **pipeline}]})


def test_line_and_zone_names_are_unique_over_the_cameras() -> None:
    line = {"name": "door", "points": [[0, 0], [1, 1]]}
    with pytest.raises(ValidationError, match="'door' is in a and b"):
        AgentConfig.model_validate(
            {"cameras": [{"name": n, "source": "synthetic", "lines": [line]} for n in ("a", "b")]}
        )
    good = config(lines=[line], zones=[{"name": "bay", "polygon": [[0, 0], [9, 0], [9, 9]], "labels": ["car"]}])
    assert good.cameras[0].zones[0].labels == ["car"] and good.cameras[0].anchor == "center"


@pytest.mark.parametrize(
    ("section", "error"),
    [
        ({}, None),
        ({"listen": "[::1]:8080"}, None),
        ({"listen": "0.0.0.0:8080", "username": "tech", "password_file": "/etc/edge-agent/page-password"}, None),
        ({"listen": "0.0.0.0:8080"}, "not a loopback address: set username and password_file"),
        ({"listen": "cam-1.local:8080"}, "not a loopback address"),
        ({"listen": "8080"}, "is not HOST:PORT"),
        ({"listen": "127.0.0.1:99999"}, "is not HOST:PORT"),
        ({"listen": "::1:8080"}, "IPv6 address in brackets"),
        ({"username": "tech"}, "username and a password"),
        ({"password_env": "X"}, "username and a password"),
        ({"username": "t", "password_env": "X", "password_file": "/f"}, "not both"),
    ],
)
def test_status_page_settings(section: dict[str, Any], error: str | None) -> None:
    if error is None:
        StatusPageSection.model_validate(section)
        return
    with pytest.raises(ValidationError, match=error):
        StatusPageSection.model_validate(section)


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        ({"conf": 0.6, "iou": 0.5, "max_det": 20, "classes": ["person", "car"]}, None),
        ({"conf": 0.0, "iou": 1.0, "max_det": 1}, None),
        ({"conf": 1.2}, "cameras.0.conf: Input should be less than or equal to 1"),
        ({"iou": -0.1}, "cameras.0.iou: Input should be greater than or equal to 0"),
        ({"max_det": 0}, "cameras.0.max_det: Input should be greater than or equal to 1"),
        ({"classes": ["person", 2]}, "classes are label names (e.g. person, car), not class ids (2)"),
        ({"classes": ["car", "car"]}, "class 'car' is listed twice"),
        ({"classes": ["car", " "]}, "a class name may not be empty"),
    ],
)
def test_a_cameras_thresholds_and_classes(settings: dict[str, Any], error: str | None) -> None:
    from agent.errors import validation_problems

    if error is None:
        pipeline = config(**settings).cameras[0]
        assert {k: getattr(pipeline, k) for k in settings} == settings
        return
    with pytest.raises(ValidationError) as refused:
        config(**settings)
    assert any(error in problem for problem in validation_problems(refused.value)), validation_problems(refused.value)


def test_a_camera_without_thresholds_leaves_them_to_the_bundle() -> None:
    pipeline = config().cameras[0]
    assert (pipeline.conf, pipeline.iou, pipeline.max_det, pipeline.classes) == (None, None, None, [])


def test_anchors_per_camera_line_and_zone() -> None:
    line = {"name": "door", "points": [[0, 0], [1, 1]], "anchor": "keypoints:15,16"}
    zone = {"name": "bay", "polygon": [[0, 0], [9, 0], [9, 9]], "anchor": "obb_center"}
    good = config(anchor="bottom_center", lines=[line], zones=[zone])
    section = good.cameras[0]
    assert (section.anchor, section.lines[0].anchor, section.zones[0].anchor) == (
        "bottom_center",
        "keypoints:15,16",
        "obb_center",
    )
    with pytest.raises(ValidationError, match="anchor 'ankles'"):
        config(lines=[{**line, "anchor": "ankles"}])
    with pytest.raises(ValidationError, match="anchor 'middle'"):
        config(anchor="middle")
