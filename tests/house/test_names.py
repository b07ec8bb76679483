"""The docs and the code name the same things: error codes, states, runtimes, decoders, modules."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

from testkit import REPO

from agent.bundles.manifest import Manifest
from agent.bundles.record import TRANSITIONS, State
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


def _documented_transitions() -> dict[State, frozenset[State]]:
    """The table under docs/architecture.md's "The life of a deployment": each row's states
    (notes in parentheses aside)."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## The life of a deployment", 1)[1].split("\n## ", 1)[0]
    table: dict[State, frozenset[State]] = {}
    for line in section.splitlines():
        cells = [re.sub(r"\([^)]*\)", "", cell) for cell in line.split("|")[1:-1]]
        if len(cells) == 2 and re.fullmatch(r"[A-Z_, ]+", cells[0].strip()):
            there = frozenset(State(word) for word in re.findall(r"[A-Z_]{3,}", cells[1]))
            table.update({State(here.strip()): there for here in cells[0].split(",")})
    return table


def test_the_life_of_a_deployment_shows_the_table_of_steps() -> None:
    assert _documented_transitions() == dict(TRANSITIONS)


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
    in_tree = ("tensorrt", "onnxruntime", "litert", "openvino", "tvm", "hailo", "rknn")
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


#: the longest line docs/architecture.md's room listing may have, so that it can be scanned
ROOM_LINE = 160
#: a room's heading names its folder first; each module is one line under it
_ROOM = re.compile(r"### `([\w/]+/)`")
_MODULE = re.compile(r"- `(\w+\.py)` — \S")


def _room_listing(text: str) -> list[str]:
    """The lines of the page's "Rooms and modules" section."""
    return text.split("\n## Rooms and modules\n", 1)[1].split("\n## ", 1)[0].splitlines()


def listing_problems(lines: list[str], rooms: dict[str, set[str]]) -> list[str]:
    """What is wrong with a room listing against `rooms` (each folder, as ``agent/daemon/``, -> the
    modules in it). A room is a heading that names its folder first (``### `agent/daemon/` —
    ...``), followed by one line per module (``- `agent.py` — what it is``). Wrong: a room
    missing, or listed that is not one; a module missing, listed twice, or listed that is not
    there; a heading or a list line of another form; a line longer than `ROOM_LINE`."""
    listed: dict[str, list[str]] = {}
    room = None
    problems = [f"longer than {ROOM_LINE}: {line[:60]}..." for line in lines if len(line) > ROOM_LINE]
    for line in lines:
        if line.startswith("#"):
            heading = _ROOM.match(line)
            room = heading.group(1) if heading else None
            if room is None or room in listed:
                problems.append(f"not a room's heading, or one listed twice: {line}")
            else:
                listed[room] = []
        elif line.startswith("- "):
            module = _MODULE.match(line)
            if module is None or room is None:
                problems.append(f"not a module's line under a room: {line}")
            else:
                listed[room].append(module.group(1))
    for name in sorted(rooms.keys() | listed.keys()):
        if name not in listed:
            problems.append(f"{name}: a room the page does not list")
        elif name not in rooms:
            problems.append(f"{name}: listed, but not a room of the package")
        else:
            said, have = listed[name], rooms[name]
            problems += [f"{name}{module}: in the folder, not on the page" for module in sorted(have - set(said))]
            problems += [f"{name}{module}: on the page, not in the folder" for module in sorted(set(said) - have)]
            problems += [f"{name}{module}: listed twice" for module in sorted({m for m in said if said.count(m) > 1})]
    return problems


def test_architecture_page_lists_the_modules_of_each_room() -> None:
    """docs/architecture.md lists every module of each room, once, and only modules that exist,
    each in a line short enough to scan; its dotted names (`agent.daemon.agent.Agent`) exist."""
    text = (REPO / "docs" / "architecture.md").read_text()
    folders = [REPO / "agent"] + [
        package.parent
        for top in ("agent", "pipelines", "runtimes")
        for package in (REPO / top).rglob("__init__.py")
        if package.parent != REPO / "agent"
    ]
    modules = {folder: {p.name for p in folder.glob("*.py")} - {"__init__.py", "__main__.py"} for folder in folders}
    rooms = {f"{folder.relative_to(REPO)}/": names for folder, names in modules.items()}
    assert listing_problems(_room_listing(text), rooms) == []
    dotted = set(re.findall(r"`((?:agent|pipelines|runtimes)(?:\.\w+){2,})`", text))
    assert dotted and [d for d in dotted if not _exists(d)] == []


def test_the_listing_check_finds_each_problem() -> None:
    """`listing_problems` on planted listings whose faults are known, so that a check that can no
    longer fail fails here."""
    rooms = {"agent/x/": {"a.py", "b.py"}, "pipelines/": {"c.py"}}
    good = [
        "intro",
        "### `agent/x/` — a room",
        "",
        "- `a.py` — one",
        "- `b.py` — two",
        "### `pipelines/` — top",
        "- `c.py` — three",
    ]
    assert listing_problems(good, rooms) == []
    stale = [*good, "- `gone.py` — a module since removed"]
    assert listing_problems(stale, rooms) == ["pipelines/gone.py: on the page, not in the folder"]
    missing = [line for line in good if "b.py" not in line]
    assert listing_problems(missing, rooms) == ["agent/x/b.py: in the folder, not on the page"]
    twice = [*good, "- `c.py` — again"]
    assert listing_problems(twice, rooms) == ["pipelines/c.py: listed twice"]
    no_room = [line for line in good if "pipelines/" not in line]
    assert listing_problems(no_room, rooms) == [
        "agent/x/c.py: on the page, not in the folder",
        "pipelines/: a room the page does not list",
    ]
    wrong_form = [*good[:-1], "- `c.py`: three"]
    assert listing_problems(wrong_form, rooms)[0] == "not a module's line under a room: - `c.py`: three"
    long = [*good[:-1], "- `c.py` — " + "x" * ROOM_LINE]
    assert listing_problems(long, rooms) == [f"longer than {ROOM_LINE}: {long[-1][:60]}..."]
    gone_room = [*good, "### `agent/gone/` — a room since removed"]
    assert listing_problems(gone_room, rooms) == ["agent/gone/: listed, but not a room of the package"]
    double = [*good, "### `agent/x/` — again"]
    assert listing_problems(double, rooms) == ["not a room's heading, or one listed twice: ### `agent/x/` — again"]
    before = ["- `a.py` — before any room", *good]
    assert listing_problems(before, rooms) == ["not a module's line under a room: - `a.py` — before any room"]


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
