"""Tests mirror the package: every test file names what it tests, and every module of the package
has a unit test that imports it or a row in docs/testing.md naming the end-to-end tests that cover
it. The check reads files only (`ast`): it imports nothing of the package and starts nothing."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from testkit import REPO

TESTS = REPO / "tests"
#: test folders that mirror a folder of the repository, file by file
MIRRORED = ("agent", "pipelines", "runtimes", "scripts", "bench", "systemd", "deploy")
#: test folders that test no one file: end to end, and the house checks (this file's folder)
APART = ("e2e", "house")
#: the packages whose modules must each be tested
PACKAGES = ("agent", "pipelines", "runtimes")
#: the docs/testing.md heading over the table of modules covered only end to end
E2E_HEADING = "Modules covered end to end"


def _norm(name: str) -> str:
    """A file name as a test name reads it: ``edge-agent.service`` is ``edge_agent_service``."""
    return re.sub(r"[-.]", "_", name)


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _test_files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (TESTS / folder).rglob("test_*.py"))


def names_its_subject(test: Path) -> bool:
    """`tests/<root>/<dir>/test_<name>.py` (or `test_<name>_<aspect>.py`) where `<root>/<dir>/`
    holds a file named `<name>` (with or without its suffix; `-` and `.` read as `_`)."""
    mirrored = REPO / test.parent.relative_to(TESTS)
    if not mirrored.is_dir():
        return False
    subject = test.stem.removeprefix("test_")
    for file in mirrored.iterdir():
        if file.is_file() and file.name != "__init__.py":
            for name in {_norm(file.stem), _norm(file.name)}:
                if subject == name or subject.startswith(f"{name}_"):
                    return True
    return False


def test_every_test_file_lies_at_its_subject_s_mirrored_path() -> None:
    found = (p.relative_to(TESTS) for p in TESTS.rglob("test_*.py"))
    stray = [p for p in found if p.parts[0] not in (*MIRRORED, *APART)]
    assert stray == [], f"test files outside tests/{{{','.join(MIRRORED + APART)}}}/ (unit tests mirror the package)"
    misnamed = [p.relative_to(TESTS) for p in _test_files(*MIRRORED) if not names_its_subject(p)]
    assert misnamed == [], "test files named after no file at the mirrored path (test_<module>[_<aspect>].py)"


def modules() -> list[str]:
    """Every module of the packages, dotted (``agent.daemon.agent``), without ``__init__`` and
    ``__main__``."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name not in ("__init__.py", "__main__.py"):
                found.append(".".join(path.relative_to(REPO).with_suffix("").parts))
    return found


def _is_module(dotted: str) -> bool:
    return (REPO / Path(*dotted.split("."))).with_suffix(".py").is_file()


def imported_modules(path: Path) -> set[str]:
    """The package modules a file imports anywhere in it (inside functions too):
    ``import a.b``, ``from a.b import c`` (``a.b``, and ``a.b.c`` where that is a module)."""
    found: set[str] = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found.update(".".join(parts[:n]) for n in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in PACKAGES and _is_module(name)}


@cache
def unit_imports() -> frozenset[str]:
    """The modules that the unit tests (every test file but tests/e2e's and tests/house's) import."""
    return frozenset().union(*(imported_modules(p) for p in _test_files(*MIRRORED)))


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _first_string(args: list[ast.expr]) -> str | None:
    """The first literal string among a call's arguments (``capsys`` and the like come first)."""
    for arg in args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if not isinstance(arg, ast.Name):
            return None
    return None


def _main_command(call: ast.Call) -> str | None:
    """``main(["status", ...])``: ``status``."""
    if _called_name(call) == "main" and call.args and isinstance(call.args[0], ast.List):
        return _first_string(call.args[0].elts)
    return None


@dataclass(frozen=True)
class Driver:
    """A testkit function that runs the CLI in-process: with a fixed command, or (``command is
    None``) the command its caller names as its first string argument."""

    command: str | None


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef]:
    yield from (node for node in tree.body if isinstance(node, ast.FunctionDef))


def _forwards(function: ast.FunctionDef, call: ast.Call) -> bool:
    """``main(list(args))``, ``main(argv)``: the call passes the function's own parameters on."""
    params = {a.arg for a in (*function.args.args, *function.args.kwonlyargs)}
    params |= {function.args.vararg.arg} if function.args.vararg else set()
    return any(isinstance(n, ast.Name) and n.id in params for arg in call.args for n in ast.walk(arg))


def _driver(function: ast.FunctionDef, known: dict[str, Driver]) -> Driver | None:
    for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
        name = _called_name(call)
        if name == "main" or (name in known and name != function.name):
            fixed = _main_command(call) if name == "main" else known[str(name)].command or _first_string(call.args)
            if fixed is not None or _forwards(function, call):
                return Driver(fixed)
    return None


@cache
def drivers() -> dict[str, Driver]:
    """testkit's functions that call ``main`` (directly or through another such function), by name."""
    functions = [f for path in sorted((TESTS / "support" / "testkit").glob("*.py")) for f in _functions(_tree(path))]
    found: dict[str, Driver] = {}
    while True:  # a driver may call another driver (``push`` calls ``cli``)
        more = {f.name: d for f in functions if f.name not in found and (d := _driver(f, found)) is not None}
        if not more:
            return found
        found |= more


def commands_run(test: Path) -> set[str]:
    """The top-level commands a test file runs in-process: ``main(["<command>", ...])``, or a
    testkit driver (`drivers`) called with or for that command."""
    found: set[str] = set()
    for call in (n for n in ast.walk(_tree(test)) if isinstance(n, ast.Call)):
        name = _called_name(call)
        if (command := _main_command(call)) is not None:
            found.add(command)
        elif name in drivers():
            fixed = drivers()[name].command
            named = fixed if fixed is not None else _first_string(call.args)
            found |= {named} if named is not None else set()
    return found


def cli_commands() -> dict[str, str]:
    """agent/cli/main.py's ``COMMANDS`` table read from its source: command -> module."""
    for node in _tree(REPO / "agent" / "cli" / "main.py").body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "COMMANDS":
            table = ast.literal_eval(node.value)
            assert isinstance(table, dict)
            return table
    raise AssertionError("agent/cli/main.py defines no COMMANDS table")


def run_by_its_test(module: str) -> bool:
    """A command module (``agent.cli.status``) whose tests/agent/cli/test_<command>.py runs it."""
    for command, name in cli_commands().items():
        test = TESTS / "agent" / "cli" / f"test_{_norm(command)}.py"
        if name == module and test.is_file() and command in commands_run(test):
            return True
    return False


def unit_tested(module: str) -> bool:
    return module in unit_imports() or run_by_its_test(module)


@dataclass(frozen=True)
class Row:
    """A row of docs/testing.md's end-to-end table: the module and the tests (``e2e/test_x.py::test_y``)."""

    module: str
    tests: tuple[str, ...]


def end_to_end_rows(text: str) -> list[Row]:
    rows, within = [], False
    for line in text.splitlines():
        if line.startswith("#"):
            within = line.lstrip("#").strip() == E2E_HEADING
        elif within and line.startswith("|") and (first := re.match(r"\| `([\w.]+)` \|", line)):
            rows.append(Row(first.group(1), tuple(re.findall(r"`([\w/]+\.py::[\w:]+)`", line))))
    return rows


def defines(test: str) -> bool:
    """``e2e/test_fleet.py::test_x`` (or ``::Class::test_x``): an end-to-end test that exists."""
    path, *names = test.split("::")
    file = TESTS / path
    if path.split("/")[0] != "e2e" or not file.is_file() or not names:
        return False
    body: list[ast.stmt] = _tree(file).body
    for name in names:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
        if node is None:
            return False
        body = node.body
    return True


def test_every_module_has_a_unit_test_or_its_end_to_end_tests_are_named() -> None:
    rows = end_to_end_rows((REPO / "docs" / "testing.md").read_text())
    listed = [row.module for row in rows]
    assert rows, f"docs/testing.md has no table under '## {E2E_HEADING}'"
    assert sorted(listed) == sorted(set(listed)), "a module with two rows"
    untested = [m for m in modules() if not unit_tested(m) and m not in listed]
    assert untested == [], f"modules that no unit test imports, and without a row under '{E2E_HEADING}'"
    unknown = [m for m in listed if m not in modules()]
    assert unknown == [], "rows naming modules that do not exist"
    stale = [m for m in listed if unit_tested(m)]
    assert stale == [], "rows for modules a unit test now imports (remove the row)"
    empty = [row.module for row in rows if not row.tests]
    assert empty == [], "rows naming no test (`e2e/test_<x>.py::test_<y>`)"
    missing = [test for row in rows for test in row.tests if not defines(test)]
    assert missing == [], "rows naming end-to-end tests that tests/e2e does not define"


def test_the_check_reads_imports_commands_and_drivers() -> None:
    """The readers above on sources whose answers are known."""
    here = TESTS / "house" / "test_layout.py"
    assert imported_modules(here) == set(), "this file imports nothing of the package"
    assert imported_modules(TESTS / "conftest.py") >= {"agent.bundles.archive", "pipelines.sources.synthetic"}
    assert cli_commands()["status"] == "agent.cli.status" and "fleet_rollout" not in cli_commands()
    assert drivers()["cli"] == Driver(None) and drivers()["push"] == Driver("fleet")
    assert names_its_subject(TESTS / "systemd" / "test_edge_agent_service.py")
    assert names_its_subject(TESTS / "agent" / "cli" / "test_fleet_rollout.py")
    assert not names_its_subject(TESTS / "agent" / "cli" / "test_nothing.py")
    assert not names_its_subject(TESTS / "agent" / "nowhere" / "test_main.py")
