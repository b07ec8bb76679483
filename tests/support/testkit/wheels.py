"""This checkout built as an edge-agent wheel of another version: an upgrade, or one that is
broken (its package raises at import). Built by the Python running the tests, offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import agent
from testkit import REPO


def checkout_wheel(folder: Path, version: str, broken: bool = False) -> Path:
    """Build this checkout with ``agent.__version__`` set to `version` into `folder`; the wheel."""
    source = folder / f"src-{version}"
    for name in ("agent", "pipelines", "runtimes"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    init = source / "agent" / "__init__.py"
    text = init.read_text().replace(f'__version__ = "{agent.__version__}"', f'__version__ = "{version}"')
    init.write_text(text + ('\nraise RuntimeError("this edge-agent is broken")\n' if broken else ""))
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    subprocess.run([*pip, "-w", str(folder), str(source)], check=True, env=env)
    (wheel,) = folder.glob(f"edge_agent-{version}-*.whl")
    return wheel
