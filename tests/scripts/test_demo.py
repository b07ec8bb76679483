"""`scripts/demo.sh`, the README's first command, as a newcomer runs it: in a fresh copy of the
checkout, whose own `.venv` the demo makes with `scripts/setup.sh` (plain: `pip install -e .`,
no dev extras, no testkit), to its last lines; then `scripts/demo.sh stop`.

The copy holds what a clone of this working tree would (tracked files and untracked ones git
does not ignore, edits included), so the test sees uncommitted work too. The venv is made anew
each run, as the demo makes it (about a minute; pip's cache keeps the wheels between runs):
one built from the development environment would carry testkit and the dev tools, and hide
exactly what this test is for, an import the plain install lacks. The demo's three ports come
from this worker's block (`testkit.net.free_ports`), so parallel workers never share one."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
from testkit import REPO
from testkit.needs import missing
from testkit.net import free_ports, wait_until

#: the longest the whole demo may take: about 2 minutes on a development machine, 4 to 8 on two
#: busy cores with the venv made and the openvino and build extras installed
DEMO_TIMEOUT_S = 1500


def copy_checkout(folder: Path) -> Path:
    """The files a clone of this working tree would hold, with their modes, under `folder`."""
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


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_demo_runs_to_its_last_lines_from_the_plain_setup_then_stop_ends_its_processes(tmp_path: Path) -> None:
    if not (shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists()) or not shutil.which("mosquitto_sub"):
        missing("mosquitto", "mosquitto and its clients are not installed (scripts/setup.sh installs them)")
    checkout = copy_checkout(tmp_path / "edge-agent")
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
                ["scripts/demo.sh"], cwd=checkout, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
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
    shutil.rmtree(checkout)  # a GB with its venv, and pytest keeps three runs' tmp_path; a failed run keeps it
