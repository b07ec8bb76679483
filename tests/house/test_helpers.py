"""One of each helper: the durable write and the file hash live in `runtimes.files`, the error
envelope in `agent.errors.error_envelope`, and a second copy anywhere in the packages fails here.

The checks read the sources (`ast`) and import nothing of the package. Each reader is also run
on planted sources whose answers are known (the last test), so a check that can no longer fail
fails there.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path

from testkit import REPO

PACKAGES = ("agent", "pipelines", "runtimes")
#: the one module that may rename over a file and loop over a file's reads into a hash
FILES = REPO / "runtimes" / "files.py"
#: the one module that may build the error envelope
ERRORS = REPO / "agent" / "errors.py"
#: attributes that read a file (``f.read(n)``, ``partial(f.read, n)``, ``f.readinto(buffer)``)
READS = frozenset({"read", "read1", "readinto", "read_bytes"})


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def os_replaces(tree: ast.Module) -> list[int]:
    """The lines that use ``os.replace`` or ``os.rename`` (called or passed on), or import them
    from ``os``: a rename over a file that skips `runtimes.files`' fsyncs. ``Path.replace`` and
    ``Path.rename`` are not found: the AST does not know a receiver's type, and
    ``str.replace`` and ``settings.replace(...)`` look the same."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("replace", "rename")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [node.lineno for alias in node.names if alias.name in ("replace", "rename")]
    return sorted(found)


def _is_sha256(call: ast.Call) -> bool:
    """``hashlib.sha256(...)``, ``sha256(...)`` (imported from hashlib), ``hashlib.new("sha256")``."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name == "new" and call.args and isinstance(call.args[0], ast.Constant):
        return str(call.args[0].value).lower() == "sha256"
    return name == "sha256"


def _reads(node: ast.AST, reads: frozenset[str] = READS) -> bool:
    """`node` mentions a read: ``f.read(n)``, ``partial(f.read, n)``, ``path.read_bytes()``."""
    return any(isinstance(n, ast.Attribute) and n.attr in reads for n in ast.walk(node))


#: the nodes that open a scope of their own: a digest made in one is not the one of another
_SCOPES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _within(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `scope`'s own code: not those of the classes and functions defined in it."""
    for child in ast.iter_child_nodes(scope):
        if not isinstance(child, _SCOPES):
            yield child
            yield from _within(child)


def _digests(scope: ast.AST) -> set[str]:
    """What `scope` assigns a new SHA-256 digest to, as written (``digest``, ``self.digest``)."""
    found: set[str] = set()
    for node in _within(scope):
        if isinstance(node, ast.Assign):
            value, targets = node.value, node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            value, targets = node.value, [node.target]
        else:
            continue
        if any(isinstance(n, ast.Call) and _is_sha256(n) for n in ast.walk(value)):
            places = (n for target in targets for n in ast.walk(target) if isinstance(n, ast.Name | ast.Attribute))
            found |= {ast.unparse(place) for place in places}
    return found


def _updates_from_a_read(loop: ast.For | ast.While, digests: set[str]) -> Iterator[int]:
    """The lines in `loop` that feed one of `digests` from a read: its header reads (``while
    chunk := f.read(n)``, ``for b in iter(partial(f.read, n), b"")``) or the update's argument does."""
    header = loop.iter if isinstance(loop, ast.For) else loop.test
    for call in (n for statement in loop.body for n in ast.walk(statement) if isinstance(n, ast.Call)):
        func = call.func
        feeds = isinstance(func, ast.Attribute) and func.attr == "update" and ast.unparse(func.value) in digests
        if feeds and (_reads(header) or any(_reads(arg) for arg in call.args)):
            yield call.lineno


def file_hashes(tree: ast.Module) -> list[int]:
    """The lines where a file is hashed by hand: a digest made by ``hashlib.sha256()`` whose
    ``.update`` is called, in the same function, in a loop over a file's reads;
    ``hashlib.file_digest``; ``sha256(path.read_bytes())``. A digest made in one place and fed in
    another (a download's chunks as they arrive, a bundle as it is unpacked) hashes no file and is
    not counted."""
    found: set[int] = set()
    for scope in (n for n in ast.walk(tree) if isinstance(n, _SCOPES)):
        digests = _digests(scope)
        for loop in (n for n in _within(scope) if isinstance(n, ast.For | ast.While)):
            found.update(_updates_from_a_read(loop, digests))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "file_digest":
            found.add(node.lineno)
        if isinstance(node, ast.Call) and _is_sha256(node) and _reads(node, frozenset({"read_bytes"})):
            found.add(node.lineno)
    return sorted(found)


def envelopes(tree: ast.Module) -> list[int]:
    """The lines that build ``{"ok": False, "error": ...}`` (a dict literal, or ``dict(ok=False,
    error=...)``) rather than call `agent.errors.error_envelope`."""
    found = []
    for node in ast.walk(tree):
        fields: dict[str, ast.AST] = {}
        if isinstance(node, ast.Dict):
            fields = {k.value: v for k, v in zip(node.keys, node.values, strict=True) if isinstance(k, ast.Constant)}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            fields = {k.arg: k.value for k in node.keywords if k.arg is not None}
        ok = fields.get("ok")
        if "error" in fields and isinstance(ok, ast.Constant) and ok.value is False:
            found.append(node.lineno)
    return sorted(found)


def _everywhere_but(allowed: Path, find: Callable[[ast.Module], list[int]]) -> dict[str, list[int]]:
    """The files of the packages but `allowed` where `find` finds something, with its lines."""
    found = {str(p.relative_to(REPO)): find(_parse(p)) for p in _sources() if p != allowed}
    return {path: lines for path, lines in found.items() if lines}


def test_files_are_renamed_into_place_only_by_runtimes_files() -> None:
    """Every temp-file-and-rename goes through `runtimes.files` (fsync of the file, the rename, fsync
    of the folder); a bare ``os.replace`` elsewhere is a write a power cut can lose or tear."""
    assert _everywhere_but(FILES, os_replaces) == {}, "use runtimes.files (atomic_write, move_into_place, ...)"
    assert len(os_replaces(_parse(FILES))) == 1, "runtimes.files renames in one place, `_replace`"


def test_files_are_hashed_only_by_runtimes_files() -> None:
    assert _everywhere_but(FILES, file_hashes) == {}, "use runtimes.files.sha256_file"
    assert file_hashes(_parse(FILES)) != [], "runtimes.files.sha256_file reads and hashes the file"


def test_the_error_envelope_is_built_only_by_agent_errors() -> None:
    assert _everywhere_but(ERRORS, envelopes) == {}, "use agent.errors.error_envelope"


def test_the_checks_find_what_is_planted() -> None:
    """The readers above on sources whose answers are known: each finds its pattern, on the line
    where it is, and passes over its look-alikes."""
    planted_renames = """
import os
from os import rename
os.replace(tmp, path)
swap = os.replace
text.replace("a", "b")
settings.replace(config)
"""
    assert os_replaces(ast.parse(planted_renames)) == [3, 4, 5]
    planted_hashes = """
import hashlib
def while_read(path):
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
def iter_read(paths):
    digest = hashlib.new("sha256")
    for path in paths:
        with path.open("rb") as f:
            for block in iter(partial(f.read, 4096), b""):
                digest.update(block)
def lambda_read(path):
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(4096), b""):
            digest.update(block)
def read_in_update(f):
    self.digest = sha256()
    while True:
        self.digest.update(f.read(4096))
def whole(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()
def stdlib(f):
    return hashlib.file_digest(f, "sha256")
def chunks_as_they_come(chunks):
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
def spans(part, index):
    for start, length in index:
        part.seek(start)
        ok = hashlib.sha256(part.read(length)).hexdigest()
def drain(self):
    while block := self._raw.read(4096):
        self.digest.update(block)
"""
    assert file_hashes(ast.parse(planted_hashes)) == [7, 13, 18, 22, 24, 26]
    planted_envelopes = """
body = {"ok": False, "error": {"code": code, "message": message}}
answer = {"ok": False, "command": name, "error": error}
other = dict(ok=False, error=error)
fine = {"ok": True, "result": result}
also_fine = {"error": error}
"""
    assert envelopes(ast.parse(planted_envelopes)) == [2, 3, 4]
