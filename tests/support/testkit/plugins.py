"""Runtime plugins that attack the agent, installed the way pip installs a package: a folder
(a "site") holding each plugin's module and one ``*.dist-info`` with an ``entry_points.txt`` of
the ``edge_agent.runtimes`` group. Put the site on ``PYTHONPATH`` and every ``edge-agent`` sees
them (tests/runtimes/test_registry_plugins.py, scripts/redteam.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from testkit import REPO

#: plugins whose import attacks the process importing it: the red team's three (issue 37 #5)
BROKEN = {
    "exitnpu": "raise SystemExit(3)",
    "segvnpu": "import ctypes\nctypes.string_at(0)",
    "hangnpu": "import time\ntime.sleep(3600)",
}
#: each plugin's module first leaves a marker file named ``<name>-<pid>`` in $PLUGIN_MARKS (when
#: set), so a test sees whether it was imported and how many times
MARK = (
    "import os, pathlib\n"
    "if 'PLUGIN_MARKS' in os.environ:\n"
    "    pathlib.Path(os.environ['PLUGIN_MARKS'], '{name}-' + str(os.getpid())).touch()\n"
)
#: what the entry points' distribution is called (``edge-agent probe`` names it)
DISTRIBUTION = "edge-agent-redteam-plugins 0.1"


def write_plugins(site: Path, modules: Mapping[str, str] = BROKEN) -> Path:
    """Install plugin modules into `site`: each a package ``<name>_plugin`` whose entry point
    ``<name>`` names its ``BACKEND``, one distribution declaring them all. Returns `site`."""
    dist = site / "edge_agent_redteam_plugins-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: edge-agent-redteam-plugins\nVersion: 0.1\n")
    points = ["[edge_agent.runtimes]"]
    for name, body in modules.items():
        package = site / f"{name}_plugin"
        package.mkdir()
        (package / "__init__.py").write_text(MARK.format(name=name) + body + "\n")
        points.append(f"{name} = {name}_plugin:BACKEND")
    (dist / "entry_points.txt").write_text("\n".join(points) + "\n")
    return site


def edge_agent_with(
    site: Path, *args: str, timeout_s: float = 3.0, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``edge-agent ARGS`` in a fresh interpreter with the plugins of `site` installed and this
    checkout's code first on the path; the plugins' imports may take `timeout_s` in the check
    process (``EDGE_AGENT_PLUGIN_TIMEOUT_S``)."""
    environment = {
        **os.environ,
        **(env or {}),
        "PYTHONPATH": os.pathsep.join((str(site), str(REPO), str(REPO / "tests" / "support"))),
        "EDGE_AGENT_PLUGIN_TIMEOUT_S": f"{timeout_s:g}",
    }
    command = [sys.executable, "-m", "agent.cli", *args]
    return subprocess.run(
        command, capture_output=True, text=True, env=environment, timeout=120, stdin=subprocess.DEVNULL, cwd=REPO
    )
