"""`agent.config.example`: the example config passes its own check."""

from __future__ import annotations

from pathlib import Path

import yaml

from agent.cli import main
from agent.config.example import example_config
from agent.config.loading import check_config, load_config


def test_the_example_config_passes_the_check(tmp_path: Path, capsys) -> None:
    key = tmp_path / "signing.pub"
    key.write_text("placeholder")
    args = ["config", "example", "--device-id", "pi-7", "--group", "dock", "--broker", "mqtts://b:8883"]
    assert main([*args, "--state-dir", str(tmp_path / "state"), "--trust-key", str(key)]) == 0
    text = capsys.readouterr().out
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    assert check_config(path) == []
    config = load_config(path)
    assert (config.device.id, config.device.group, config.mqtt and config.mqtt.port) == ("pi-7", "dock", 8883)
    assert config.trust_keys == [key] and not config.allow_unsigned
    unsigned = yaml.safe_load(example_config(state_dir=tmp_path))
    assert unsigned["allow_unsigned"] is True, "without a key the example accepts unsigned bundles, and says so"
