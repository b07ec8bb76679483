"""`runtimes.registry`'s plugins loaded lazily and isolated, for real: small plugin packages written
into a folder with a ``*.dist-info/entry_points.txt`` of the ``edge_agent.runtimes`` group, and
``edge-agent`` run in a fresh interpreter with that folder on ``PYTHONPATH``. A plugin that raises
`SystemExit` at import, one that segfaults (``ctypes.string_at(0)``) and one that never returns
are each left out with the reason; ``--help`` imports none of them, ``probe`` names them."""

from __future__ import annotations

import json
import logging
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from testkit import FAKES
from testkit.plugins import BROKEN, DISTRIBUTION, edge_agent_with, write_plugins

from runtimes.registry import GROUP, IN_TREE, collect, plugin_timeout_s

X86 = ["--root", str(FAKES / "x86-generic"), "--arch", "x86_64"]


def edge_agent(site: Path, marks: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return edge_agent_with(site, *args, env={"PLUGIN_MARKS": str(marks)})


@pytest.fixture
def broken_site(tmp_path: Path) -> tuple[Path, Path]:
    site, marks = tmp_path / "site", tmp_path / "marks"
    marks.mkdir()
    write_plugins(site, BROKEN)
    return site, marks


@pytest.mark.slow
def test_help_and_a_command_that_needs_no_backend_import_no_plugin(broken_site: tuple[Path, Path]) -> None:
    site, marks = broken_site
    helped = edge_agent(site, marks, "--help")
    assert helped.returncode == 0 and "probe" in helped.stdout, helped.stderr
    runtime_help = edge_agent(site, marks, "detect", "--help")
    assert runtime_help.returncode == 0 and "--runtime" in runtime_help.stdout, runtime_help.stderr
    keys = edge_agent(site, marks, "keygen", "--out", str(site.parent / "keys"))
    assert keys.returncode == 0 and (site.parent / "keys" / "signing.pub").is_file(), keys.stderr
    assert sorted(p.name for p in marks.iterdir()) == [], "no plugin imported, not even in a check process"


@pytest.mark.slow
def test_probe_names_each_plugin_left_out_with_its_reason_and_lives(broken_site: tuple[Path, Path]) -> None:
    site, marks = broken_site
    proc = edge_agent(site, marks, "probe", "--json", *X86)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plugins = {p["name"]: p for p in json.loads(proc.stdout)["runtime_plugins"]}
    assert sorted(plugins) == ["exitnpu", "hangnpu", "segvnpu"]
    assert "SystemExit: 3" in plugins["exitnpu"]["error"]
    assert "killed its check process (SIGSEGV)" in plugins["segvnpu"]["error"]
    assert "did not finish within 3 s" in plugins["hangnpu"]["error"]
    assert all(p["distribution"] == DISTRIBUTION for p in plugins.values())
    imports = sorted(mark.name.split("-")[0] for mark in marks.iterdir())
    assert imports == sorted(BROKEN), "each imported once, in a check process, never again by probe itself"

    text = edge_agent(site, marks, "probe", *X86)
    assert text.returncode == 0, text.stderr[-3000:]
    left_out = "segvnpu      plugin left out (edge-agent-redteam-plugins 0.1): importing segvnpu_plugin:BACKEND killed"
    assert left_out in text.stdout, text.stdout


def test_a_plugin_raising_any_base_exception_at_import_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In the process itself (where a check process cannot run): `SystemExit` and
    `KeyboardInterrupt` raised by a plugin's import are reasons, never an exit."""
    (tmp_path / "exits.py").write_text("raise SystemExit(3)\n")
    (tmp_path / "interrupts.py").write_text("raise KeyboardInterrupt\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    points = [
        metadata.EntryPoint("exits", "exits:BACKEND", GROUP),
        metadata.EntryPoint("interrupts", "interrupts:BACKEND", GROUP),
        metadata.EntryPoint("vetted", "never_imported:BACKEND", GROUP),
    ]
    with caplog.at_level(logging.ERROR, logger="runtimes.registry"):
        registry = collect(IN_TREE, points, {("vetted", "never_imported:BACKEND"): "it hung in a check process"})
    errors = {p.name: p.error for p in registry.plugins}
    assert errors == {
        "exits": "importing exits:BACKEND failed: SystemExit: 3",
        "interrupts": "importing interrupts:BACKEND failed: KeyboardInterrupt: KeyboardInterrupt",
        "vetted": "it hung in a check process",
    }
    assert tuple(registry.backends.values()) == IN_TREE


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 60.0), ("5", 5.0), ("0", 1.0), ("1e9", 600.0), ("nan", 60.0), ("soon", 60.0), ("9" * 5000, 60.0)],
)
def test_the_plugins_time_limit_is_bounded(value: str | None, expected: float) -> None:
    environ = {} if value is None else {"EDGE_AGENT_PLUGIN_TIMEOUT_S": value}
    assert plugin_timeout_s(environ) == expected
