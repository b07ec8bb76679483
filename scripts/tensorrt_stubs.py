#!/usr/bin/env python3
"""Put TensorRT 10.13's type stubs where mypy finds them: build/typings/{tensorrt,tensorrt_bindings}.

TensorRT itself cannot be installed here (its wheels come from NVIDIA's index), so mypy checks
`runtimes/tensorrt_*.py` against the signatures published as ``tensorrt-stubs`` on PyPI. That
wheel cannot be a normal dependency (it requires the ``tensorrt`` metapackage, whose sdist
downloads from NVIDIA's index), and its generated stubs do not parse as they are. This script:

1. downloads the wheel without its dependencies (``pip download --no-deps``) into build/,
   unless it is there already;
2. copies its ``tensorrt/`` and ``tensorrt_bindings/`` stubs into ``build/typings/``;
3. repairs what does not parse or misleads mypy: parameters named ``in`` (a keyword), the one
   parameter without a default after defaulted ones (``add_scale_nd``'s ``channel_axis``), the
   ``import tensorrt_libs`` of a package that has no stubs, and a module variable ``bool`` that
   shadows the builtin type for every annotation after it (line endings become LF first).

pyproject.toml points mypy's ``mypy_path`` at build/typings and sets ``ignore_errors`` for those
stub modules only; scripts/test.sh runs this before mypy. Idempotent; prints the folder.

    python scripts/tensorrt_stubs.py [--out build/typings]
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "tensorrt-stubs==10.13.0.35.1"
WHEEL = "tensorrt_stubs-10.13.0.35.1-py3-none-any.whl"
PACKAGES = ("tensorrt", "tensorrt_bindings")

#: (pattern, replacement, least number of replacements expected in the whole stub set)
REPAIRS: tuple[tuple[re.Pattern[str], str, int], ...] = (
    (re.compile(r"(?<=[(,] )in(?=: )|(?<=\()in(?=: )"), "in_", 1),
    (re.compile(r"(power: Weights = None, channel_axis: int)\)"), r"\1 = ...)", 1),
    (re.compile(r"^import tensorrt_libs as tensorrt_libs\n", re.MULTILINE), "", 1),
    (re.compile(r"^bool: .*\n", re.MULTILINE), "", 1),
)


def wheel(download_dir: Path) -> Path:
    """The stub wheel, downloaded with pip (no dependencies) when it is not in `download_dir`."""
    path = download_dir / WHEEL
    if not path.is_file():
        download_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", PACKAGE, "-d", str(download_dir)]
        subprocess.run(command, check=True)
    return path


def repair(text: str, counts: list[int]) -> str:
    for i, (pattern, replacement, _) in enumerate(REPAIRS):
        text, n = pattern.subn(replacement, text)
        counts[i] += n
    return text


def install_stubs(out: Path, download_dir: Path) -> Path:
    """Extract and repair the stubs into `out`; raises `SystemExit` when a repair no longer
    applies (a different wheel) or a stub still does not parse."""
    counts = [0] * len(REPAIRS)
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(wheel(download_dir)) as archive:
        for name in archive.namelist():
            if name.split("/")[0] in PACKAGES and name.endswith(".pyi"):
                target = staging / name
                target.parent.mkdir(parents=True, exist_ok=True)
                text = repair(archive.read(name).decode().replace("\r\n", "\n"), counts)
                try:
                    ast.parse(text, filename=name)
                except SyntaxError as exc:
                    raise SystemExit(f"{name}:{exc.lineno}: still does not parse after the repairs: {exc.msg}") from exc
                target.write_text(text)
    missing = [REPAIRS[i][0].pattern for i, n in enumerate(counts) if n < REPAIRS[i][2]]
    if missing:
        raise SystemExit(f"{WHEEL}: these repairs found nothing to repair (another wheel?): {missing}")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "typings")
    parser.add_argument("--download-dir", type=Path, default=REPO / "build" / "wheels")
    args = parser.parse_args()
    print(install_stubs(args.out, args.download_dir))


if __name__ == "__main__":
    main()
