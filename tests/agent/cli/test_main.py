"""`agent.cli.main`: usage errors exit 2, every expected failure is one line and never a traceback."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from testkit import DEMO_MODELS, REPO

from agent.cli import main
from agent.cli.main import COMMANDS, build_parser, named_command, summary_parser


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_usage_errors_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["detect", "m.onnx", "i.png", "--conf", "1.5"])
    assert exit_info.value.code == 2
    assert "expected a number within 0..1, got 1.5" in capsys.readouterr().err


def test_no_traceback_in_a_real_process(tmp_path) -> None:
    junk = write(tmp_path / "junk.onnx", b"nope")
    proc = subprocess.run(
        [sys.executable, "-m", "agent.cli", "detect", str(junk), str(junk)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "ONNX Runtime cannot load" in proc.stderr


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


def test_scripts_run_from_the_repository(tmp_path: Path) -> None:
    """`python -m agent.cli` (what the tests and the service use) prints its help."""
    run = subprocess.run([sys.executable, "-m", "agent.cli", "--help"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0 and "fleet" in run.stdout


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["detect", "m.onnx", "i.png"], "detect"),
        (["-v", "-v", "bench", "m.onnx"], "bench"),
        (["-vv", "fleet", "status"], "fleet"),
        (["fleet", "--help"], "fleet"),  # help after the command is the command's help
        (["--help", "detect"], None),
        (["-h"], None),
        (["-v"], None),
        ([], None),
        (["nosuch", "detect"], None),  # the whole parser names the choices
    ],
)
def test_named_command(argv: list[str], named: str | None) -> None:
    assert named_command(argv) == named


def test_only_the_named_command_is_imported(tmp_path: Path) -> None:
    """A detection imports no other command's module and, for a bare model file, none of the
    bundles' code (signatures, archives): what ``detect``'s start-up is measured on."""
    image = tmp_path / "frame.png"
    cv2.imwrite(str(image), np.zeros((64, 96, 3), np.uint8))
    code = (
        "import json, sys\nfrom agent.cli import main\n"
        f"status = main(['detect', {str(DEMO_MODELS / 'demo_detector.onnx')!r}, {str(image)!r}, '--json'])\n"
        "watched = ('agent.cli.', 'agent.bundles', 'cryptography')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith(watched))))\n"
        "sys.exit(status)"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    imported = json.loads(run.stdout.splitlines()[-1])
    assert imported == ["agent.cli.args", "agent.cli.detect", "agent.cli.failure", "agent.cli.main"]


def test_help_lists_every_command(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    listed = capsys.readouterr().out
    assert all(f"    {name} " in listed for name in COMMANDS)


def test_help_without_the_commands_is_the_whole_parsers_help() -> None:
    """``--help`` imports no command module: its lines come from `SUMMARIES`, which must say
    what each module's own parser says, in the same order."""
    assert summary_parser().format_help() == build_parser().format_help()


def test_version(capsys) -> None:
    """``--version`` prints `agent.__version__`, and the distribution setuptools builds from
    pyproject.toml carries that same version (``dynamic``, read from agent/__init__.py): a
    literal ``version`` put back in pyproject.toml, or an ``attr`` naming something else, would
    let the wheel and the running code disagree (docs/fleet.md#versions)."""
    import semver
    from setuptools.config.pyprojecttoml import read_configuration

    import agent

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    built = read_configuration(REPO / "pyproject.toml")["project"]["version"]
    assert capsys.readouterr().out == f"edge-agent {built}\n"
    assert built == agent.__version__
    assert semver.Version.is_valid(built), f"{built!r} is not SemVer"


def test_each_handler_gets_one_credentials_filter_however_often_main_runs(tmp_path: Path) -> None:
    """`main` filters camera passwords out of every root handler; run again in one process (the
    tests run it hundreds of times) it must not add another filter to each handler: they piled
    up, and every log line went through all of them (20,000 lines took 30 s instead of 0.4)."""
    from pipelines.sources.frames import CredentialsFilter

    handler = logging.NullHandler()
    logging.getLogger().addHandler(handler)
    try:
        for run in range(3):
            assert main(["keygen", "--out", str(tmp_path / f"keys{run}")]) == 0
        assert sum(isinstance(f, CredentialsFilter) for f in handler.filters) == 1
    finally:
        logging.getLogger().removeHandler(handler)
