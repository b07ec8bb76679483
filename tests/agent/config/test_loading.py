"""`agent.config.loading`: every problem of an agent.yaml with its line, missing files and variables,
secrets from a value, a file or the environment, a recursive alias; the bounds on a file's size,
nesting and nodes checked before it is parsed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from agent.cli import main
from agent.config.loading import (
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_NODES,
    ConfigLines,
    check_config,
    load_config,
)
from agent.config.models import Secret
from agent.errors import ConfigError

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
        "cameras.0.source@9",
        "cameras.0.max_fps@10",
        "cameras.0.workers@11",
        "telemetry.interval_s@13",
        "runtime@14",
        "colour@15",
    }, lines


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("device: [1, 2\n", "not valid YAML"),
        ("- just\n- a list\n", "must be a mapping"),
        ("cameras:\n  - {name: a, source: synthetic}\n  - {name: a, source: synthetic}\n", "must be unique"),
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
                "cameras": [{"source": str(tmp_path / "clip.mp4")}],
            }
        )
    )
    problems = check_config(path)
    assert any(p.startswith("trust_keys.0: no such file") for p in problems), problems
    assert any(p.startswith("mqtt.tls.ca_file: no such file") for p in problems), problems
    assert any("EDGE_TEST_MISSING is not set" in p for p in problems), problems
    assert any(p.startswith("cameras.0.source: no such video file") for p in problems), problems


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
    ("text", "problem"),
    [
        ("a: &a [*a]\n", "a: Extra inputs are not permitted"),
        ("cameras: &p [*p]\n", "cameras.0: Input should be a valid dictionary or instance of CameraSection"),
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


def test_config_lines_locate_a_key_found_after_loading(tmp_path: Path) -> None:
    """A key path to FILE:LINE: key (the nearest key above it that the file has), for problems
    found once a version is known (a class name it lacks)."""
    from agent.config.loading import ConfigLines

    path = tmp_path / "agent.yaml"
    path.write_text("cameras:\n  - name: gate\n    source: synthetic\n    classes: [car, persn]\n")
    lines = ConfigLines.read(path)
    assert lines.where(["cameras", "0", "classes", "1"]) == f"{path}:4: cameras.0.classes.1"
    assert lines.where(["cameras", "0", "conf"]) == f"{path}:2: cameras.0.conf", "conf is not in the file"
    assert ConfigLines.read(None).where(["cameras", "0", "classes"]) == "cameras.0.classes"
    assert ConfigLines.read(tmp_path / "gone.yaml").where(["a", "b"]) == f"{tmp_path / 'gone.yaml'}: a.b"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("max_clock_skew_s: .inf\n", "max_clock_skew_s: Input should be a finite number"),  # no command too old
        ("cameras: [{source: synthetic, max_fps: .inf}]\n", "cameras.0.max_fps: Input should be a finite number"),
        ("deployments: {probation_s: .inf}\n", "deployments.probation_s: Input should be a finite number"),
        ("telemetry: {interval_s: .inf}\n", "telemetry.interval_s: Input should be a finite number"),
    ],
)
def test_a_number_that_is_not_finite_is_a_problem_with_its_line(tmp_path: Path, text: str, problem: str) -> None:
    """YAML's ``.inf`` and ``.nan`` are floats: every float of agent.yaml must be finite."""
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    problems = check_config(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}:") and problem in problems[0], problems


def test_a_config_larger_than_the_bound_is_refused_after_reading_one_byte_more(tmp_path: Path, capsys) -> None:
    """A config linked to /dev/zero grew a SIGHUP's daemon to 2.8 GB and ended it (issue 37): at
    most `MAX_CONFIG_BYTES` + 1 bytes are read, and a file past the bound is one problem naming it."""
    endless = tmp_path / "agent.yaml"
    endless.symlink_to("/dev/zero")
    refusal = f"{endless}: larger than the {MAX_CONFIG_BYTES} bytes (1 MiB) a config may be; not read further"
    assert check_config(endless) == [refusal]
    with pytest.raises(ConfigError) as raised:
        load_config(endless)
    assert str(raised.value) == refusal
    assert ConfigLines.read(endless).lines == {}
    assert main(["config", "check", str(endless)]) == 1
    assert capsys.readouterr().out == refusal + "\n"

    config = "device: {id: cam-01}\n"
    at_the_bound = tmp_path / "padded.yaml"
    at_the_bound.write_text(config + "#" * (MAX_CONFIG_BYTES - len(config) - 1) + "\n")
    assert load_config(at_the_bound).device.id == "cam-01"
    at_the_bound.write_text(config + "#" * (MAX_CONFIG_BYTES - len(config)) + "\n")
    assert check_config(at_the_bound) == [refusal.replace(str(endless), str(at_the_bound))]


def nested(levels: int, style: str) -> str:
    """A config whose key ``a`` holds `levels` collections, each inside the one before."""
    if style == "flow lists":
        return "a: " + "[" * levels + "]" * levels + "\n"
    if style == "flow mappings":
        return "a: " + "{b: " * levels + "1" + "}" * levels + "\n"
    if style == "block mappings":
        return "a:\n" + "".join(f"{'  ' * i}b:\n" for i in range(1, levels)) + f"{'  ' * levels}b: 1\n"
    return "a:\n  " + "- " * levels + "1\n"  # block lists on one line


STYLES = ["flow lists", "flow mappings", "block mappings", "block lists"]


@pytest.mark.parametrize("style", STYLES)
def test_nesting_deeper_than_the_bound_is_refused_before_parsing(tmp_path: Path, style: str) -> None:
    """YAML nested 20,000 deep raised RecursionError out of the loader, past a SIGHUP's handler
    (issue 37): the nesting is counted as the file is scanned, and the first collection past
    `MAX_CONFIG_DEPTH` levels is one problem with its line."""
    path = tmp_path / "agent.yaml"
    path.write_text(nested(20_000 if style.startswith("flow") else MAX_CONFIG_DEPTH + 5, style))
    (problem,) = check_config(path)
    assert re.fullmatch(rf"{re.escape(str(path))}:\d+: nested deeper than {MAX_CONFIG_DEPTH} levels, .*", problem)
    with pytest.raises(ConfigError, match=f"nested deeper than {MAX_CONFIG_DEPTH} levels"):
        load_config(path)
    assert ConfigLines.read(path).lines == {}, "the line finder refuses it too"

    path.write_text(nested(MAX_CONFIG_DEPTH - 1, style))  # with the top-level mapping: at the bound
    assert check_config(path) == [f"{path}:1: a: Extra inputs are not permitted"]


def test_more_nodes_than_the_bound_are_refused_before_parsing(tmp_path: Path, capsys) -> None:
    """`config check` took 45 s and 626 MB on a file of 300,000 keys (issue 37): such a file is
    larger than the size bound, and a smaller one with more than `MAX_CONFIG_NODES` keys, values
    and list items is refused once the scan counted them, before anything is built."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("".join(f"k{i}: {i}\n" for i in range(300_000)))
    assert check_config(keys) == [
        f"{keys}: larger than the {MAX_CONFIG_BYTES} bytes (1 MiB) a config may be; not read further"
    ]
    items = tmp_path / "items.yaml"
    items.write_text("a: [" + "0," * MAX_CONFIG_NODES + "0]\n")
    assert items.stat().st_size < MAX_CONFIG_BYTES
    (problem,) = check_config(items)
    assert problem == (
        f"{items}:1: more than {MAX_CONFIG_NODES} keys, values and list items (an alias counts as what it "
        "repeats), more than any config needs; not parsed further"
    )
    assert main(["config", "check", str(items)]) == 1
    assert capsys.readouterr().out == problem + "\n"


def test_aliases_count_as_what_they_repeat(tmp_path: Path) -> None:
    """A billion laughs: nine levels of ten aliases each are a billion list items once expanded.
    PyYAML shares an alias's value instead of copying it and the validators stop at the schema's
    depth, so nothing walked the expansion yet (each key was one Extra inputs problem); the scan
    counts each alias as the nodes it repeats, so that nothing ever can. An anchor used a few
    times is fine."""
    laughs = "l0: &l0 [lol]\n" + "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n" for i in range(1, 10))
    path = tmp_path / "agent.yaml"
    path.write_text(laughs)
    (problem,) = check_config(path)
    assert problem.startswith(f"{path}:") and f"more than {MAX_CONFIG_NODES} keys, values and list items" in problem
    shared = "zone: &zone [[0, 0], [10, 0], [10, 10]]\n"
    path.write_text(shared + "".join(f"z{i}: *zone\n" for i in range(20)))
    assert len(check_config(path)) == 21, "one Extra inputs problem per key: the aliases are counted, not refused"


OLD_NAMES = """\
allow_unsigned: true
cameras:
  share_model: false
  batch_wait_ms: 5
pipelines:
  - name: door
    source: synthetic
    fps: 15
  - name: yard
    source: synthetic:2
    conf: 0.4
"""


def test_the_old_names_of_the_cameras_and_serving_load_as_the_new_ones_with_a_deprecation(tmp_path: Path) -> None:
    """Deprecated for one release: a ``pipelines:`` list is ``cameras:``, a ``cameras:`` mapping
    ``serving:``; the config is the same as in the new words, and says what to rename."""
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(OLD_NAMES)
    new.write_text(OLD_NAMES.replace("cameras:", "serving:").replace("pipelines:", "cameras:"))
    before, after = load_config(old), load_config(new)
    assert [c.name for c in before.cameras] == ["door", "yard"] and before.cameras[1].conf == 0.4
    assert before.serving.share_model is False and before.serving.batch_wait_ms == 5
    assert before.model_dump() == after.model_dump(), "the same settings, whatever their names"
    assert after.deprecations == ()
    assert len(before.deprecations) == 2
    assert all("deprecated" in note and "next release" in note for note in before.deprecations)
    assert any("pipelines:" in n and "cameras:" in n for n in before.deprecations)
    assert any("serving:" in n for n in before.deprecations)
    assert "deprecations" not in before.model_dump() and "deprecations" not in before.model_dump_json()


def test_the_old_and_the_new_form_at_once_are_refused_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("pipelines:\n  - {name: a, source: synthetic}\ncameras:\n  - {name: b, source: synthetic}\n")
    with pytest.raises(ConfigError, match=r"both pipelines: .* and cameras:"):
        load_config(path)
    path.write_text("cameras: {batch: false}\nserving: {batch: true}\n")
    with pytest.raises(ConfigError, match=r"both cameras: as a mapping .* and serving:"):
        load_config(path)
    path.write_text("deprecations: [x]\n")
    with pytest.raises(ConfigError, match="not a setting"):
        load_config(path)


def test_a_problem_under_an_old_name_has_its_line_and_config_check_warns_of_the_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(OLD_NAMES.replace("conf: 0.4", "conf: 4"))
    assert check_config(path) == [f"{path}:11: cameras.1.conf: Input should be less than or equal to 1"]
    path.write_text(OLD_NAMES.replace("batch_wait_ms: 5", "batch_wait_ms: -5"))
    assert check_config(path) == [f"{path}:4: serving.batch_wait_ms: Input should be greater than or equal to 0"]
    path.write_text(OLD_NAMES)
    assert main(["config", "check", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("WARNING: pipelines: is deprecated, renamed cameras:")]
    assert [line for line in out if line.startswith("WARNING: cameras: as a mapping")]
