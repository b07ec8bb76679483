"""A camera's ``samples:`` section: off unless asked for, a bad band or mask refused naming its
key (and its line, from a file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent.config.loading import load_config
from agent.config.models import AgentConfig
from agent.errors import ConfigError, validation_problems

SQUARE = [[0, 0], [100, 0], [100, 100], [0, 100]]


def _camera(samples: dict[str, Any]) -> AgentConfig:
    return AgentConfig.model_validate({"cameras": [{"source": "synthetic", "samples": samples}]})


def test_samples_are_off_unless_a_camera_asks() -> None:
    assert not AgentConfig.model_validate({"cameras": [{"source": "synthetic"}]}).cameras[0].samples.enabled
    on = _camera({"enabled": True, "score_band": [0.2, 0.5], "privacy_masks": [SQUARE]}).cameras[0].samples
    assert on.enabled and on.score_band == (0.2, 0.5) and on.privacy_masks == [SQUARE]


@pytest.mark.parametrize(
    ("samples", "error"),
    [
        ({"score_band": [0.6, 0.3]}, "cameras.0.samples.score_band: Value error, score_band is [lo, hi] with 0 <= lo"),
        ({"score_band": [0.5, 0.5]}, "cameras.0.samples.score_band: Value error, score_band is [lo, hi]"),
        ({"score_band": [0.2, 1.5]}, "cameras.0.samples.score_band: Value error, score_band is [lo, hi]"),
        ({"score_band": [0.2]}, "cameras.0.samples.score_band.1: Field required"),
        ({"random_share": 1.5}, "cameras.0.samples.random_share: Input should be less than or equal to 1"),
        ({"max_mb": 0}, "cameras.0.samples.max_mb: Input should be greater than 0"),
        ({"max_age_h": 0}, "cameras.0.samples.max_age_h: Input should be greater than 0"),
        ({"min_interval_s": -1}, "cameras.0.samples.min_interval_s: Input should be greater than or equal to 0"),
        ({"privacy_masks": [[[0, 0], [1, 1]]]}, "cameras.0.samples.privacy_masks.0: List should have at least 3"),
        ({"privacy_masks": [SQUARE] * 33}, "cameras.0.samples.privacy_masks: List should have at most 32 items"),
        ({"privacy_masks": [[[0, 0], [1], [1, 1]]]}, "cameras.0.samples.privacy_masks.0.1: Value error, a point"),
        ({"enable": True}, "cameras.0.samples.enable: Extra inputs are not permitted"),
    ],
)
def test_a_bad_setting_is_refused_naming_its_key(samples: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError) as refused:
        _camera(samples)
    problems = validation_problems(refused.value)
    assert any(problem.startswith(error) for problem in problems), problems


def test_a_bad_band_in_a_file_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "cameras:\n  - source: synthetic\n    samples:\n      enabled: true\n      score_band: [0.7, 0.2]\n"
    )
    with pytest.raises(ConfigError, match=r"agent.yaml:5.*score_band is \[lo, hi\]"):
        load_config(path)
