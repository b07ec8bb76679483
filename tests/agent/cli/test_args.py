"""`agent.cli.args`: the argument types at their boundaries, and the device config the options make."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from agent.cli.args import (
    device_config,
    line_points,
    number_within,
    positive_int,
    state_arguments,
    trust_arguments,
    unit_interval,
)
from agent.paths import DEFAULT_CONFIG, DEFAULT_STATE_DIR


@pytest.mark.parametrize(("text", "value"), [("0", 0.0), ("1", 1.0), ("0.25", 0.25)])
def test_unit_interval_accepts_its_ends(text: str, value: float) -> None:
    assert unit_interval(text) == value


@pytest.mark.parametrize("text", ["-0.01", "1.01", "half", "nan"])
def test_unit_interval_refuses_what_lies_outside(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"within 0\.\.1"):
        unit_interval(text)


def test_positive_int_starts_at_one() -> None:
    assert positive_int("1") == 1 and positive_int("300") == 300
    for text in ("0", "-3", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match=f"expected a positive integer, got .*{text}"):
            positive_int(text)


def test_number_within_names_its_range_and_unit() -> None:
    seconds = number_within(0.5, 60, "seconds")
    assert seconds("0.5") == 0.5 and seconds("60") == 60.0
    for text in ("0.49", "60.5", "soon"):
        with pytest.raises(argparse.ArgumentTypeError) as refused:
            seconds(text)
        assert str(refused.value) == f"expected 0.5..60 seconds, got {text!r}"


def test_line_points_are_four_numbers_of_two_different_points() -> None:
    assert line_points("0,10.5,640,20") == (0.0, 10.5, 640.0, 20.0)
    for text, words in (("1,2,3", "got 3 in"), ("1,2,3,4,5", "got 5 in"), ("a,b,c,d", "four numbers")):
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            line_points(text)
    with pytest.raises(argparse.ArgumentTypeError, match="two points must differ"):
        line_points("5,5,5,5")
    assert line_points("5,5,5,6") == (5.0, 5.0, 5.0, 6.0), "points that differ in one coordinate are a line"


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    trust_arguments(parser)
    state_arguments(parser)  # the --config of trust_arguments is kept, not added twice
    return parser.parse_args(argv)


def test_device_config_lets_the_command_line_override_the_config(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(f"state_dir: {tmp_path / 'from-config'}\ntrust_keys: [{tmp_path / 'a.pub'}]\nkeep_versions: 2\n")
    assert device_config(_parse()).state_dir == DEFAULT_STATE_DIR
    from_file = device_config(_parse("--config", str(config)))
    assert (from_file.state_dir, from_file.trust_keys, from_file.allow_unsigned) == (
        tmp_path / "from-config",
        [tmp_path / "a.pub"],
        False,
    )
    given = device_config(
        _parse("--config", str(config), "--state-dir", str(tmp_path / "s"), "--trust-key", "b.pub", "--allow-unsigned")
    )
    assert given.state_dir == tmp_path / "s"
    assert given.trust_keys == [tmp_path / "a.pub", Path("b.pub")], "the command line's keys add to the config's"
    assert given.allow_unsigned and given.keep_versions == 2


def test_the_default_paths() -> None:
    assert (Path("/etc/edge-agent/agent.yaml"), Path("/var/lib/edge-agent")) == (DEFAULT_CONFIG, DEFAULT_STATE_DIR)
