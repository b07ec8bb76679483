"""The docs and the code name the same things: error codes, states, runtimes, decoders, modules."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from testkit import REPO

from agent.bundles.manifest import Manifest
from agent.bundles.record import State
from agent.cli.main import build_parser
from agent.config.models import AgentConfig
from agent.errors import ErrorCode
from agent.governor.levels import BatteryLevel, ThermalLevel
from agent.hardware.power import INPUT_RAILS
from pipelines.decoding.decoders import DECODER_CHOICES, DECODER_NAMES
from runtimes.registry import BACKENDS, RUNTIME_NAMES, RuntimeSettings
from runtimes.selection import PREFERENCES

DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]


_CODE = re.compile(r"`([A-Z][A-Z0-9_]{2,})`")


#: upper-case words in backticks that are neither codes nor states
_OTHER_WORDS = {"TCP_NODELAY"}


def _documented_codes() -> dict[str, set[str]]:
    """The first column of every table under an "Error codes" heading, per document."""
    found: dict[str, set[str]] = {}
    for doc in DOCS:
        in_codes = False
        for line in doc.read_text().splitlines():
            if line.startswith("#"):
                in_codes = "error codes" in line.lower()
            elif in_codes and line.startswith("|"):
                found.setdefault(doc.name, set()).update(_CODE.findall(line.split("|")[1]))
    return found


def test_every_error_code_is_documented_and_every_documented_code_exists() -> None:
    documented = set().union(*_documented_codes().values())
    defined = {code.value for code in ErrorCode}
    assert defined - documented == set(), "codes without a row in an 'Error codes' table of docs/"
    assert documented - defined == set(), "documented codes that agent.errors.ErrorCode does not define"


def test_upper_case_words_in_the_docs_are_codes_or_states() -> None:
    """... or the governor's levels, or the Jetson input rails the sensors know by name."""
    known = {code.value for code in ErrorCode} | {state.value for state in State} | _OTHER_WORDS
    known |= {level.value for level in (*ThermalLevel, *BatteryLevel)} | set(INPUT_RAILS)
    for doc in DOCS:
        unknown = {word for word in _CODE.findall(doc.read_text()) if word not in known}
        unknown = {word for word in unknown if not word.startswith("EDGE_AGENT_")}  # environment variables
        assert unknown == set(), f"{doc.name} names codes the code does not define"


def test_every_deployment_state_is_documented() -> None:
    text = (REPO / "docs" / "mqtt.md").read_text() + (REPO / "docs" / "bundles.md").read_text()
    assert [state.value for state in State if state.value not in text] == []


def _choices(*path: str) -> tuple[str, ...]:
    parser: argparse.ArgumentParser = build_parser()
    *commands, option = path
    for name in commands:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    action = next(a for a in parser._actions if option in a.option_strings)
    assert action.choices is not None
    return tuple(action.choices)


def test_runtime_names_come_from_one_table() -> None:
    in_tree = ("tensorrt", "onnxruntime", "litert", "openvino")
    assert in_tree == RUNTIME_NAMES, "the in-tree backends, in the table's order"
    assert tuple(BACKENDS) == RUNTIME_NAMES
    assert tuple(c.type for c in RuntimeSettings().configs) == RUNTIME_NAMES
    assert ("auto", *RUNTIME_NAMES) == PREFERENCES
    assert _choices("detect", "--runtime") == _choices("bench", "--runtime") == ("auto", *RUNTIME_NAMES)
    schema = AgentConfig.model_json_schema()
    assert tuple(schema["properties"]["runtime"]["enum"]) == ("auto", *RUNTIME_NAMES)
    assert tuple(schema["$defs"]["RuntimeSettings"]["properties"]) == RUNTIME_NAMES
    for name, backend in BACKENDS.items():
        assert backend.config().type == name


def test_decoder_names_come_from_one_table() -> None:
    assert ("auto", *DECODER_NAMES) == DECODER_CHOICES
    assert _choices("detect", "--decoder") == _choices("bundle", "build", "--decoder") == DECODER_CHOICES
    assert tuple(Manifest.model_json_schema()["properties"]["decoder"]["enum"]) == DECODER_NAMES


def test_error_codes_and_states_read_as_their_names() -> None:
    assert f"{ErrorCode.BUSY}: x" == "BUSY: x"
    assert str(State.ROLLED_BACK) == "ROLLED_BACK" and State("QUEUED") is State.QUEUED


def _exists(dotted: str) -> bool:
    """A module (``agent.daemon.agent``), or a name defined at the top of one
    (``agent.daemon.agent.Agent``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO / Path(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            rest = parts[cut:]
            if not rest:
                return True
            defined = re.search(rf"^(class|def) {rest[0]}\b|^{rest[0]}\b.*=", module.read_text(), re.MULTILINE)
            return len(rest) <= 2 and defined is not None
    return False


def test_architecture_page_matches_the_modules() -> None:
    """docs/architecture.md's room table names every module of each room, and only modules that
    exist; its dotted names (`agent.daemon.agent.Agent`) exist too."""
    text = (REPO / "docs" / "architecture.md").read_text()
    named: dict[Path, set[str]] = {}
    for row in text.splitlines():
        first = re.match(r"\| `([\w/.]+)` \|", row)
        if first is None:
            continue
        place = REPO / first.group(1)
        if first.group(1).endswith("/"):
            named.setdefault(place, set()).update(re.findall(r"`(\w+\.py)`", row))
        else:
            named.setdefault(place.parent, set()).add(place.name)
    rooms = [
        package.parent
        for top in ("agent", "pipelines", "runtimes")
        for package in (REPO / top).rglob("__init__.py")
        if package.parent != REPO / "agent"
    ]
    for room in rooms:
        modules = {p.name for p in room.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
        assert named.get(room, set()) == modules, f"{room.relative_to(REPO)}: the page and the code differ"
    top = {p.name for p in (REPO / "agent").glob("*.py") if p.name != "__init__.py"}
    assert named[REPO / "agent"] == top
    dotted = set(re.findall(r"`((?:agent|pipelines|runtimes)(?:\.\w+){2,})`", text))
    assert dotted and [d for d in dotted if not _exists(d)] == []


def _room_of(module: str) -> str | None:
    """``agent.daemon.agent`` -> ``daemon``; ``agent.errors`` -> ``errors``;
    ``pipelines.sources.frames`` -> ``pipelines``; anything else (the stdlib, libraries) -> None."""
    parts = module.split(".")
    if parts[0] in ("pipelines", "runtimes"):
        return parts[0]
    return parts[1] if parts[0] == "agent" and len(parts) > 1 else None


def _imported_rooms() -> dict[str, set[str]]:
    """Each room of agent/ (a package, or a module at agent/'s top) -> the other rooms it imports,
    read from every module's import statements (those inside functions too)."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "agent").rglob("*.py"):
        inside = path.relative_to(REPO / "agent").parts
        if inside == ("__init__.py",) or inside[0] == "demo":
            continue
        room = inside[0].removesuffix(".py")
        found.setdefault(room, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            found[room].update(other for n in names if (other := _room_of(n)) not in (None, room))
    return found


def test_the_room_table_is_the_imports() -> None:
    """docs/architecture.md's table of which room imports which is what the code imports: an
    import added or dropped without the page fails here."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text[text.index("| room | imports") :].split("\n\n")[0].splitlines()[2:]
    documented: dict[str, set[str]] = {}
    for row in table:
        rooms, imports = (cell.strip() for cell in row.strip("|").split("|"))
        listed = set() if imports.startswith("(") else {name.strip() for name in imports.split(",")}
        for room in re.findall(r"`(\w+)`", rooms):
            documented[room] = listed
    assert documented == _imported_rooms()


def test_no_two_modules_share_a_file_name() -> None:
    """A file name leads to one module: no two modules of the package share one (the packages'
    `__init__.py` and `__main__.py` aside)."""
    seen: dict[str, list[str]] = {}
    for top in ("agent", "pipelines", "runtimes"):
        for path in (REPO / top).rglob("*.py"):
            if path.name not in ("__init__.py", "__main__.py"):
                seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
