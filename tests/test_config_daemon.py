"""agent.yaml: every problem reported with its line, the example works as is, secrets, schema."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agent.cli import main
from agent.config.example import example_config
from agent.config.loading import check_config, load_config, schema_json
from agent.config.models import AgentConfig, MqttSection, Secret
from agent.errors import ConfigError
from tests.conftest import REPO

BAD = """\
device:
  id: "cam 01"
mqtt:
  broker: http://broker:1883
  tls: {cert_file: /x.pem}
  password: {file: /a, env: B}
pipelines:
  - name: cam0
    source: synthetic:abc
    max_fps: 0
    workers: 0
telemetry:
  interval_s: 0.01
runtime: tpu
colour: blue
"""


def test_config_check_lists_every_problem_with_its_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(BAD)
    assert main(["config", "check", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    found = {re.sub(r"^.*?:(\d+): ([\w.]+):.*$", r"\2@\1", line) for line in lines}
    assert found == {
        "device.id@2",
        "mqtt.broker@4",
        "mqtt.tls@5",
        "mqtt.password@6",
        "pipelines.0.source@9",
        "pipelines.0.max_fps@10",
        "pipelines.0.workers@11",
        "telemetry.interval_s@13",
        "runtime@14",
        "colour@15",
    }, lines


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("device: [1, 2\n", "not valid YAML"),
        ("- just\n- a list\n", "must be a mapping"),
        ("pipelines:\n  - {name: a, source: synthetic}\n  - {name: a, source: synthetic}\n", "must be unique"),
    ],
)
def test_config_errors_name_the_problem(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_config(path)


def test_config_check_reports_missing_files_and_variables(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("EDGE_TEST_MISSING", raising=False)
    path = tmp_path / "agent.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "trust_keys": [str(tmp_path / "nope.pub")],
                "mqtt": {
                    "broker": "mqtts://broker.example",
                    "username": "cam",
                    "password": {"env": "EDGE_TEST_MISSING"},
                    "tls": {"ca_file": str(tmp_path / "ca.pem")},
                },
                "pipelines": [{"source": str(tmp_path / "clip.mp4")}],
            }
        )
    )
    problems = check_config(path)
    assert any(p.startswith("trust_keys.0: no such file") for p in problems), problems
    assert any(p.startswith("mqtt.tls.ca_file: no such file") for p in problems), problems
    assert any("EDGE_TEST_MISSING is not set" in p for p in problems), problems
    assert any(p.startswith("pipelines.0.source: no such video file") for p in problems), problems


def test_secrets_come_from_a_value_a_file_or_the_environment(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "pw").write_text("from-file\nignored\n")
    monkeypatch.setenv("EDGE_TEST_PW", "from-env")
    assert Secret(value="inline").resolve() == "inline"
    assert Secret(file=tmp_path / "pw").resolve() == "from-file"
    assert Secret(env="EDGE_TEST_PW").resolve() == "from-env"
    with pytest.raises(ConfigError, match="secret file"):
        Secret(file=tmp_path / "missing").resolve()
    monkeypatch.delenv("EDGE_TEST_PW")
    with pytest.raises(ConfigError, match="EDGE_TEST_PW"):
        Secret(env="EDGE_TEST_PW").resolve()


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


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["fleet", "status", "--broker", "http://x"], "is not mqtt://HOST"),
        (["fleet", "status", "--broker", "mqtt://127.0.0.1:1"], "cannot reach the broker mqtt://127.0.0.1:1"),
        (["fleet", "push", "missing.bundle", "--target", "device:a", "--broker", "mqtt://127.0.0.1:1"], "not found"),
        (["fleet", "snapshot", "--target", "group:a", "-o", "x.jpg", "--broker", "mqtt://127.0.0.1:1"], "device:ID"),
        (
            ["fleet", "push", str(REPO / "pyproject.toml"), "--target", "device:a", "--broker", "mqtt://127.0.0.1:1"],
            "not a bundle",
        ),
        (["fleet", "rollback", "--target", "cam-1", "--broker", "mqtt://127.0.0.1:1"], "is not device:ID"),
        (["config", "check", "/nonexistent/agent.yaml"], "cannot read"),
        (["run", "--config", "/nonexistent/agent.yaml"], "cannot read"),
    ],
)
def test_daemon_and_fleet_commands_fail_with_one_clear_line(args: list[str], words: str, capsys) -> None:
    status = main(args)
    out = capsys.readouterr()
    assert status == 1, out
    text = out.err + out.out
    assert words in text and "Traceback" not in text, text


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a: &a [*a]\n", "a: Extra inputs are not permitted"),
        ("pipelines: &p [*p]\n", "pipelines.0: Input should be a valid dictionary or instance of PipelineSection"),
        ("device: &d {id: x, group: *d}\n", "device.group: Input should be a valid string"),
    ],
)
def test_a_recursive_yaml_alias_is_one_problem_with_its_line(tmp_path: Path, capsys, text: str, problem: str) -> None:
    """An alias that contains itself once sent the line finder into endless recursion."""
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    assert check_config(path) == [f"{path}:1: {problem}"]
    assert main(["config", "check", str(path)]) == 1
    assert "Traceback" not in capsys.readouterr().out
