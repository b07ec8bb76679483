"""`edge-agent enrol`: a claim that is not one, or has expired, is refused with the reason, and
agent.yaml is left as it was (the whole enrolment: tests/agent/cli/test_fleet_enrol.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from agent.cli import enrol
from agent.cli.failure import CliError


def args(tmp_path: Path, claim: Path) -> argparse.Namespace:
    config = tmp_path / "agent.yaml"
    config.write_text("device: {id: old}\n")
    return argparse.Namespace(
        claim=claim, config=config, state_dir=tmp_path / "state", device_id="cam-1", group=None, wait=1.0
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("broker: [unclosed", "neither YAML nor JSON"),
        ("just a string", "Input should be a valid dictionary"),
        ("broker: mqtt://b\nclaim: c\nusername: u\npassword: p\noperator_keys: []\nexpires_at: 1\n", "operator_keys"),
    ],
)
def test_a_claim_that_is_not_one_is_refused_and_changes_nothing(tmp_path: Path, text: str, reason: str) -> None:
    claim = tmp_path / "claim.yaml"
    claim.write_text(text)
    namespace = args(tmp_path, claim)
    with pytest.raises(CliError, match=reason):
        enrol.run(namespace)
    assert yaml.safe_load(namespace.config.read_text()) == {"device": {"id": "old"}}
    assert not namespace.state_dir.exists()
