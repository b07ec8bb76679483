"""`agent.config.recipes`: every board recipe is a valid source and makes a valid example config;
docs/cameras.md shows them all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import REPO

from agent.cli import main
from agent.config.models import CameraSection
from agent.config.recipes import RECIPES, recipe
from pipelines.sources.pipe_commands import pipe_command, pipe_tool
from pipelines.sources.specs import source_kind


@pytest.mark.parametrize("name", [r.name for r in RECIPES])
def test_every_recipe_is_a_valid_source_and_an_example_config(name: str, tmp_path: Path, capsys) -> None:
    found = recipe(name)
    assert found is not None
    CameraSection(source=found.source)
    if pipe_tool(found.source):
        command = pipe_command(found.source)
        assert command.live, "every recipe is a camera"
    else:
        assert source_kind(found.source) == "camera"
    assert main(["config", "example", "--source", name, "--state-dir", str(tmp_path / "state")]) == 0
    example = tmp_path / "agent.yaml"
    example.write_text(capsys.readouterr().out)
    assert json.dumps(found.source) in example.read_text()
    assert "loop:" not in example.read_text(), "a camera is live: no loop"
    assert main(["config", "check", str(example)]) == 0
    assert "no problems found" in capsys.readouterr().out


def test_the_cameras_page_shows_every_recipe() -> None:
    text = (REPO / "docs" / "cameras.md").read_text()
    for found in RECIPES:
        assert f"`{found.name}`" in text and found.source in text, found.name
