"""`scripts/demo.sh`, the README's first command, as a newcomer runs it: in a fresh copy of the
checkout, whose own `.venv` the demo makes with `scripts/setup.sh` (plain: `pip install -e .`,
no dev extras, no testkit), to its last lines; then `scripts/demo.sh stop`.

The copy holds what a clone of this working tree would (tracked files and untracked ones git
does not ignore, edits included), so the test sees uncommitted work too. The demo's three ports
come from this worker's block (`testkit.net.free_ports`), so parallel workers never share one.

What is cached: the copy's `.venv`, and only it. Making it and pip installing the package, then
the demo's `openvino` and `build` extras, took 33 s of the test's 160 (24 s reused, the extras
installed again), and the GB copy was deleted at the end; so the copy lives at a fixed path (a
venv is not relocatable), `~/.cache/edge-agent-demo/<key>/edge-agent`
(`EDGE_AGENT_DEMO_CACHE` moves the folder), copied there fresh at each run with its `.venv` kept.
The key is the version of `python3` (the one setup.sh uses) and the hash of pyproject.toml: a
change to the package's requirements gets a venv made from nothing, and the other keys' folders
are removed. A lock file beside them makes a second run (another worker, another checkout) wait
for the first.
Why it still tests the plain setup: before the demo starts, every distribution that the plain
install (`edge-agent` without extras, followed through its requirements) does not need is
uninstalled (the extras the last run's demo added), so the venv is what a newcomer's plain
`pip install -e .` makes; then the demo runs `scripts/setup.sh` as a newcomer does (its pip
install then finds everything installed), its steps before the extras see no onnx or openvino,
and the demo installs the extras itself. A venv built from the development environment would
carry testkit and the dev tools, and hide exactly what this test is for, an import the plain
install lacks."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from testkit import REPO
from testkit.needs import missing
from testkit.net import free_ports, wait_until

from runtimes.files import sha256_file

#: the longest the whole demo may take: about 2 minutes on a development machine, 4 to 8 on two
#: busy cores with the venv made and the openvino and build extras installed
DEMO_TIMEOUT_S = 1500


def copy_checkout(folder: Path) -> Path:
    """The files a clone of this working tree would hold, with their modes, under `folder`: all
    that was there before goes, but for its `.venv`."""
    if folder.exists():
        for entry in folder.iterdir():
            if entry.name == ".venv":
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source, target = REPO / name, folder / name
        if not source.is_file() and not source.is_symlink():
            continue  # deleted in the working tree
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    return folder


#: the demo's checkouts, each with its venv, kept between runs (the module's docstring says why)
CACHE = Path(os.environ.get("EDGE_AGENT_DEMO_CACHE") or Path.home() / ".cache" / "edge-agent-demo")

#: run by the venv's python: the installed distributions that the plain install of edge-agent
#: does not need (pip's own tools aside), one a line; `requires` followed with the extras asked
PLAIN_ONLY = r"""
from importlib.metadata import distributions
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name

installed = {canonicalize_name(d.metadata["Name"]): d for d in distributions()}
needed, todo = set(), [(name, frozenset()) for name in ("edge-agent", "pip", "setuptools", "wheel")]
while todo:
    name, extras = todo.pop()
    name = canonicalize_name(name)
    if (name, extras) in needed or name not in installed:
        continue
    needed.add((name, extras))
    for text in installed[name].requires or ():
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in extras | {""}):
            todo.append((requirement.name, frozenset(requirement.extras)))
print("\n".join(sorted(set(installed) - {name for name, _ in needed})))
"""


def cache_key() -> str:
    """The Python version of setup.sh's `python3` and the hash of pyproject.toml."""
    python = os.environ.get("PYTHON", "python3")
    version = subprocess.run(
        [python, "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return f"py{version}-{sha256_file(REPO / 'pyproject.toml')[:16]}"


@contextmanager
def cached_checkout() -> Iterator[Path]:
    """This working tree copied fresh into the cache's folder for its key, that folder's `.venv`
    kept and brought back to the plain install; held under the cache's lock until the end."""
    CACHE.mkdir(parents=True, exist_ok=True)
    key = cache_key()
    with (CACHE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second run waits for the first to end
        for old in CACHE.iterdir():
            if old.is_dir() and old.name != key:
                shutil.rmtree(old)  # a GB each, for a pyproject.toml or a Python gone
        checkout = copy_checkout(CACHE / key / "edge-agent")
        python = checkout / ".venv" / "bin" / "python"
        if python.exists():
            extra = subprocess.run([python, "-c", PLAIN_ONLY], capture_output=True, text=True, check=True).stdout
            if names := extra.split():
                subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", *names], check=True)
        yield checkout


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.long(seconds=200)
def test_the_demo_runs_to_its_last_lines_from_the_plain_setup_then_stop_ends_its_processes(tmp_path: Path) -> None:
    if not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()) or not shutil.which("mosquitto_sub"):
        missing("mosquitto", "mosquitto and its clients are not installed (scripts/setup.sh installs them)")
    with cached_checkout() as checkout:
        broker_port, page_port, sim_port = free_ports(3)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env |= {
            "EDGE_AGENT_DEMO_BROKER_PORT": str(broker_port),
            "EDGE_AGENT_DEMO_PAGE_PORT": str(page_port),
            "EDGE_AGENT_DEMO_SIM_PORT": str(sim_port),
        }
        log = tmp_path / "demo.log"
        pids: dict[str, int] = {}
        started = time.monotonic()
        try:
            with log.open("wb") as out:
                # a session of its own: past the timeout, all it started goes (the simulated fleet too)
                demo = subprocess.Popen(
                    ["scripts/demo.sh"],
                    cwd=checkout,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                try:
                    returncode = demo.wait(DEMO_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    os.killpg(demo.pid, signal.SIGKILL)
                    demo.wait()
                    raise
            text = log.read_text(errors="replace")
            print(f"scripts/demo.sh took {time.monotonic() - started:.0f} s")
            assert returncode == 0, f"scripts/demo.sh exited {returncode}:\n{text[-6000:]}"
            assert not (checkout / ".venv" / "bin" / "pytest").exists(), "the plain setup installed the dev tools"
            assert "Traceback" not in text, text[-6000:]
            # the simulated fleet, the step that needed testkit: every device took the push
            assert re.search(r"^\s+succeeded: 10$", text, re.MULTILINE), text[-6000:]
            # its last lines: where to look, on the ports it was given
            lines = text.rstrip().splitlines()
            where = "Where to look (the broker and the agent keep running; stop them with: scripts/demo.sh stop)"
            assert where in lines, text[-6000:]
            tail = lines[lines.index(where) :]
            assert len(tail) == 8, tail
            assert f"  everything:         mosquitto_sub -p {broker_port} -t 'edge/#' -v" in tail
            assert any(line.startswith(f"  the status page:    http://127.0.0.1:{page_port}/ ") for line in tail), tail
            pids = {name: int((checkout / "demo-out" / f"{name}.pid").read_text()) for name in ("agent", "mosquitto")}
            assert all(alive(pid) for pid in pids.values()), "the broker and the agent keep running"
        finally:
            stop = subprocess.run(["scripts/demo.sh", "stop"], cwd=checkout, env=env, capture_output=True, text=True)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        assert stop.stdout.splitlines() == ["stopped agent", "stopped mosquitto"]
        wait_until(lambda: not any(alive(pid) for pid in pids.values()), 30, "the agent and the broker to end")
