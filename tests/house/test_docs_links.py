"""README.md, CONTRIBUTING.md and docs/ stand alone: nothing in them leads out of the
repository, and every link to a file of it finds the file (and, for a page, the heading it
names).

A link (``[text](target)``) is read relative to the page it is on, as GitHub reads it: it must
stay inside the checkout and name a file or folder there, and an ``#anchor`` on a Markdown page
must be one of that page's headings. Any other path is read as the commands read it, from the
checkout's root: ``../`` anywhere else (a command's argument, a path in prose) leaves the
repository, and so does the development machine's ``/work/``. Links with a scheme (``https:``)
are not followed. The checks read the files only; the last test runs them on planted pages.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

from testkit import REPO

DOCS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
#: a Markdown link or image: its text (which may go on over a line break, not a blank line) and
#: its target (an optional title after it)
LINK = re.compile(r"(!?\[(?:[^\]\n]|\n(?!\n))*\])\(\s*<?([^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
#: a reference-style link's definition: ``[name]: target``
DEFINITION = re.compile(r"^ {0,3}(\[[^\]\n]+\]):[ \t]*<?(\S+?)>?(?:[ \t]+\"[^\"\n]*\")?[ \t]*$", re.MULTILINE)
#: a target with a scheme (``https:``, ``mailto:``): not a file of the repository
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
#: a path outside a link that leaves the checkout: ``../`` (not the ellipsis ``.../``), ``/work/``
OUTSIDE = re.compile(r"(?<!\.)\.\./|/work/")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped, each
    space a ``-`` (``## INT8 the OpenVINO way (NNCF)`` -> ``int8-the-openvino-way-nncf``)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (those in fenced code are not headings); a repeated
    heading's anchors get ``-1``, ``-2``, ... as on GitHub."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = anchor = slug(heading.group(1))
            n = 0
            while anchor in found:
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


@cache
def _anchors_of(path: Path) -> frozenset[str]:
    return frozenset(anchors(path.read_text()))


def target_problem(page: Path, target: str, repo: Path = REPO) -> str | None:
    """What is wrong with `target`, a link on `page`: None when it is a URL or leads to a file or
    folder of `repo` (and, on a Markdown page, to one of its headings)."""
    if SCHEME.match(target):
        return None
    path, _, anchor = target.partition("#")
    if path.startswith("/"):
        return "an absolute path"
    where = (page.parent / unquote(path)).resolve() if path else page
    if where != repo and repo not in where.parents:
        return "outside the repository"
    if not where.exists():
        return "no such file"
    if anchor and where.suffix == ".md" and unquote(anchor) not in _anchors_of(where):
        return f"no such heading in {where.name}"
    return None


def problems(page: Path, text: str, repo: Path = REPO) -> list[str]:
    """Every link of `text` (the contents of `page`) that leads out of `repo` or to nothing, and
    every path outside its links that leaves the checkout, as ``LINE: what``."""
    found: list[tuple[int, str]] = []
    for link in [*LINK.finditer(text), *DEFINITION.finditer(text)]:
        if why := target_problem(page, link.group(2), repo):
            found.append((text.count("\n", 0, link.start(2)) + 1, f"{link.group(2)}: {why}"))
    # the text without the links' targets (each line kept where it was), read from the root
    prose = DEFINITION.sub(lambda m: m.group(1), text)
    prose = LINK.sub(lambda m: m.group(1) + "\n" * m.group(0)[len(m.group(1)) :].count("\n"), prose)
    for path in OUTSIDE.finditer(prose):
        found.append((prose.count("\n", 0, path.start()) + 1, f"names {path.group(0)!r}: outside the repository"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_readme_and_docs_lead_nowhere_outside_the_repository() -> None:
    assert len(DOCS) > 10, "README.md, CONTRIBUTING.md and the pages of docs/"
    found = {doc.relative_to(REPO).as_posix(): problems(doc, doc.read_text()) for doc in DOCS}
    assert {doc: lines for doc, lines in found.items() if lines} == {}


def test_the_checks_find_each_way_out(tmp_path: Path) -> None:
    """`problems` on planted pages whose faults are known, so that a check that can no longer fail
    fails here."""
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Page\n\n## Known limits (today)\n\n```\n# not a heading\n```\n## Known limits (today)\n")
    (tmp_path / "README.md").write_text("# Read me\n")
    fine = (
        "[up](../README.md) [here](#known-limits-today) [again](#known-limits-today-1) [itself](page.md)\n"
        '[web](https://example.org/../x) [folder](../docs/) ![img](page.md "a title") .../agent.lock\n'
        "[readme]: ../README.md#read-me\n"
    )
    assert problems(page, fine, tmp_path) == []
    planted = {
        "see ../shared/DESIGN.md": ["1: names '../': outside the repository"],
        "python3 -m venv /work/ul-env": ["1: names '/work/': outside the repository"],
        "[design](../../shared/DESIGN.md)": ["1: ../../shared/DESIGN.md: outside the repository"],
        "[gone](gone.md)": ["1: gone.md: no such file"],
        "[abs](/etc/passwd)": ["1: /etc/passwd: an absolute path"],
        "[old](page.md#known-limits-for-now)": ["1: page.md#known-limits-for-now: no such heading in page.md"],
        "[code](#not-a-heading)": ["1: #not-a-heading: no such heading in page.md"],
        "[ref]: ../missing.md": ["1: ../missing.md: no such file"],
        "two lines\nof [a link\nwhose text goes on](gone.md#x)": ["3: gone.md#x: no such file"],
        "line one\n[x](../README.md) and `--model ../shared/models/m.onnx`": ["2: names '../': outside the repository"],
    }
    assert {text: problems(page, text, tmp_path) for text in planted} == planted
