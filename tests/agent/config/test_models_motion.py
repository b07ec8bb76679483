"""A camera's ``motion:`` section: its defaults are the detector's and the gate's, a bad value
is refused naming its key (and its line, from a file), and it maps onto `MotionSettings`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.config.loading import load_config
from agent.config.models import AgentConfig, MotionSection
from agent.errors import ConfigError, validation_problems
from pipelines.motion import MotionSettings
from pipelines.motion_gate import MotionGate
from pipelines.regions import RegionSchedule

SQUARE = [[0, 0], [100, 0], [100, 100], [0, 100]]


def _camera(motion: dict[str, Any]) -> AgentConfig:
    return AgentConfig.model_validate({"cameras": [{"source": "synthetic", "motion": motion}]})


def test_the_defaults_are_the_detector_s_and_the_gate_s() -> None:
    section, gate = MotionSection(), MotionGate()
    assert section.enabled is False
    detector = {f.name: getattr(MotionSettings(), f.name) for f in dataclasses.fields(MotionSettings)}
    assert {name: getattr(section, name) for name in detector if name != "masks"} == {
        name: value for name, value in detector.items() if name != "masks"
    }
    assert (section.keepalive_fps, section.idle_interval_s) == (gate.keepalive_fps, gate.idle_interval_s)
    assert AgentConfig.model_validate({"cameras": [{"source": "synthetic"}]}).cameras[0].motion is None
    assert (section.regions, section.full_frame_interval_s) == (False, RegionSchedule().full_frame_interval_s)


def test_a_section_maps_onto_the_detector_s_settings() -> None:
    motion = _camera({"enabled": True, "width": 160, "threshold": 30, "min_area": 50, "masks": [SQUARE]})
    section = motion.cameras[0].motion
    assert section is not None and section.enabled
    settings = section.settings()
    assert (settings.width, settings.threshold, settings.min_area) == (160, 30, 50)
    assert settings.masks == (((0.0, 0.0), (100.0, 0.0), (100.0, 100.0), (0.0, 100.0)),)


@pytest.mark.parametrize(
    ("motion", "error"),
    [
        ({"width": 32}, "cameras.0.motion.width: Input should be greater than or equal to 64"),
        ({"threshold": 0}, "cameras.0.motion.threshold: Input should be greater than or equal to 1"),
        ({"threshold": 256}, "cameras.0.motion.threshold: Input should be less than or equal to 255"),
        ({"min_area": 0}, "cameras.0.motion.min_area: Input should be greater than or equal to 1"),
        ({"learning_rate": 0}, "cameras.0.motion.learning_rate: Input should be greater than 0"),
        ({"learning_rate": 1.5}, "cameras.0.motion.learning_rate: Input should be less than or equal to 1"),
        ({"global_change": 0}, "cameras.0.motion.global_change: Input should be greater than 0"),
        ({"keepalive_fps": 0}, "cameras.0.motion.keepalive_fps: Input should be greater than 0"),
        ({"idle_interval_s": 0}, "cameras.0.motion.idle_interval_s: Input should be greater than 0"),
        ({"idle_interval_s": 61}, "cameras.0.motion.idle_interval_s: Input should be less than or equal to 60"),
        ({"idle_interval_s": float("inf")}, "cameras.0.motion.idle_interval_s: Input should be a finite number"),
        ({"masks": [[[0, 0], [1, 1]]]}, "cameras.0.motion.masks.0: List should have at least 3 items"),
        ({"masks": [[[0, 0]] * 65]}, "cameras.0.motion.masks.0: List should have at most 64 items"),
        ({"masks": [SQUARE] * 33}, "cameras.0.motion.masks: List should have at most 32 items"),
        ({"masks": [[[0, 0], [1], [1, 1]]]}, "cameras.0.motion.masks.0.1: Value error, a point is [x, y]"),
        ({"threshhold": 20}, "cameras.0.motion.threshhold: Extra inputs are not permitted"),
        ({"full_frame_interval_s": 0}, "cameras.0.motion.full_frame_interval_s: Input should be greater than 0"),
        ({"full_frame_interval_s": 61}, "cameras.0.motion.full_frame_interval_s: Input should be less than or equal"),
        ({"regions": True}, "cameras.0.motion: Value error, regions: true needs enabled: true"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(motion: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError) as refused:
        _camera(motion)
    problems = validation_problems(refused.value)
    assert any(problem.startswith(error) for problem in problems), problems


def test_a_bad_setting_in_a_file_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("cameras:\n  - source: synthetic\n    motion:\n      enabled: true\n      threshold: 300\n")
    with pytest.raises(ConfigError, match=r"agent.yaml:5.*threshold.*less than or equal to 255"):
        load_config(path)
