"""A camera's ``health:`` section: on by default, its thresholds' defaults are the check's, a
bad value is refused naming its key (and its line, from a file), and it maps onto
`HealthThresholds`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.config.loading import load_config
from agent.config.models import AgentConfig, CameraHealthSection
from agent.errors import ConfigError, validation_problems
from pipelines.camera_health import HealthThresholds


def _camera(health: dict[str, Any]) -> AgentConfig:
    return AgentConfig.model_validate({"cameras": [{"source": "synthetic", "health": health}]})


def test_the_defaults_are_the_check_s_and_it_is_on() -> None:
    section = CameraHealthSection()
    check = {f.name: getattr(HealthThresholds(), f.name) for f in dataclasses.fields(HealthThresholds)}
    assert {name: getattr(section, name) for name in check} == check
    assert set(CameraHealthSection.model_fields) == {"enabled", *check}
    assert AgentConfig.model_validate({"cameras": [{"source": "synthetic"}]}).cameras[0].health.enabled is True


def test_a_section_maps_onto_the_check_s_thresholds() -> None:
    section = _camera({"interval_s": 2, "frozen_s": 5, "moved_degrees": 4.5, "hold_s": 0}).cameras[0].health
    thresholds = section.thresholds()
    assert (thresholds.interval_s, thresholds.frozen_s, thresholds.moved_degrees, thresholds.hold_s) == (2, 5, 4.5, 0)
    assert thresholds.width == HealthThresholds().width


@pytest.mark.parametrize(
    ("health", "error"),
    [
        ({"interval_s": 0}, "cameras.0.health.interval_s: Input should be greater than 0"),
        ({"interval_s": 61}, "cameras.0.health.interval_s: Input should be less than or equal to 60"),
        ({"width": 16}, "cameras.0.health.width: Input should be greater than or equal to 32"),
        ({"frozen_s": 0}, "cameras.0.health.frozen_s: Input should be greater than 0"),
        ({"dark_luma": -1}, "cameras.0.health.dark_luma: Input should be greater than or equal to 0"),
        ({"bright_luma": 256}, "cameras.0.health.bright_luma: Input should be less than or equal to 255"),
        ({"dark_luma": 200, "bright_luma": 100}, "cameras.0.health: Value error, dark_luma (200.0) must be below"),
        ({"defocus_fraction": 1}, "cameras.0.health.defocus_fraction: Input should be less than 1"),
        ({"moved_fraction": 0}, "cameras.0.health.moved_fraction: Input should be greater than 0"),
        ({"moved_degrees": 90}, "cameras.0.health.moved_degrees: Input should be less than 90"),
        ({"baseline_frames": 9}, "cameras.0.health.baseline_frames: Input should be greater than or equal to 10"),
        ({"hold_s": float("inf")}, "cameras.0.health.hold_s: Input should be a finite number"),
        ({"frozen": 30}, "cameras.0.health.frozen: Extra inputs are not permitted"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(health: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError) as refused:
        _camera(health)
    problems = validation_problems(refused.value)
    assert any(problem.startswith(error) for problem in problems), problems


def test_every_accepted_section_makes_valid_thresholds() -> None:
    """The bounds here are at least as strict as the check's own (its `__post_init__` never
    raises on a config that loaded)."""
    edges = {"interval_s": 60, "width": 32, "hold_s": 0, "dark_luma": 0, "bright_luma": 255, "min_contrast": 0}
    edges |= {"defocus_fraction": 0.99, "baseline_frames": 10, "moved_degrees": 89.9, "reference_after_s": 0}
    _camera(edges).cameras[0].health.thresholds()


def test_a_bad_setting_in_a_file_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("cameras:\n  - source: synthetic\n    health:\n      enabled: true\n      frozen_s: -1\n")
    with pytest.raises(ConfigError, match=r"agent.yaml:5.*frozen_s.*greater than 0"):
        load_config(path)
