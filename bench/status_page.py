#!/usr/bin/env python3
"""Benchmark: what the status page costs the daemon (CPU, memory) and how fast ``/api/status`` answers.

One daemon per run, in a child process of its own (the agent started in it as ``edge-agent run``
does), on the demo bundle with one synthetic camera (15 FPS, ``max_fps`` 10) and no broker, in
three cases that alternate in rounds (a noisy neighbour hits all alike):

- ``off``: no ``status_page`` in agent.yaml;
- ``on``: the page served, nobody looking;
- ``browser``: the page served and open in one headless chromium (Debian's), which polls
  ``/api/status``, ``/api/problems`` and ``/api/history`` every 2 s, the events and the log every
  5 s, and loads the camera's annotated frame each time.

Per run, after a warm-up, over a window: the CPU time of the page's own threads (``web``: the
server's event loop, ``web-history``, and the ``AnyIO worker thread``s that call into the agent;
read from /proc per thread, threads that end meanwhile included), the whole process's CPU time
(percent of one core; chromium is another process, not counted), and the RSS at the end. The
page's threads are the direct cost; the whole process also moves with the camera's inference,
which on a shared machine varies by a few percent from run to run, so both are reported. After
the last browser window, with the page still open, ``GET /api/status`` is timed over one
keep-alive connection, each request more than a second after the previous one so that every
answer reads the agent anew (the page reuses a snapshot for one second); then ``/api/problems``,
``/metrics`` and the camera's snapshot the same way.

Goals: the page with a browser open <= 2 % of a core; ``/api/status`` <= 20 ms median; RSS with
the page on <= 30 MB above off.

Usage: python bench/status_page.py [--rounds 3] [--warmup 15] [--window 30] [--requests 40] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent

CASES = ("off", "on", "browser")
ENDPOINTS = ("/api/status", "/api/problems", "/metrics", "/api/cameras/cam0/snapshot.jpg")
PAGE_THREADS = ("web", "AnyIO worker thread")  # "web" also matches "web-history"


# -- the child: one daemon, measured from inside --------------------------------------------------


class ThreadClock:
    """CPU seconds of this process's threads whose names start with `prefixes`, from
    /proc/self/task/<tid>/stat, sampled every `every_s` so threads that end are counted too."""

    def __init__(self, prefixes: tuple[str, ...], every_s: float = 0.5) -> None:
        self.prefixes, self._tick = prefixes, os.sysconf("SC_CLK_TCK")
        self._start: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_loop, args=(every_s,), name="bench-clock", daemon=True)

    def _read(self) -> dict[int, float]:
        found = {}
        for thread in threading.enumerate():
            if thread.native_id is None or not thread.name.startswith(self.prefixes):
                continue
            try:
                fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # it ended between enumerate and read: its last sample stands
            found[thread.native_id] = (int(fields[11]) + int(fields[12])) / self._tick  # utime + stime
        return found

    def start(self) -> None:
        self._start = self._read()
        self._last = dict(self._start)
        self._thread.start()

    def _sample_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self._last.update(self._read())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self._last.update(self._read())
        return sum(seconds - self._start.get(tid, 0.0) for tid, seconds in self._last.items())


def child(config_path: Path, warmup: float, window: float) -> None:
    """Run the agent; after the window print one JSON line; exit when stdin closes."""
    from agent.config.loading import load_config
    from agent.daemon.agent import Agent
    from agent.hardware.board import probe

    agent = Agent(load_config(config_path), probe())
    agent.start()
    try:
        time.sleep(warmup)
        clock, process = ThreadClock(PAGE_THREADS), psutil.Process()
        clock.start()
        cpu0, wall0 = time.process_time(), time.monotonic()
        time.sleep(window)
        seconds = time.monotonic() - wall0
        page_s, cpu_s = clock.stop(), time.process_time() - cpu0
        rss_mb = process.memory_info().rss / 2**20
        print(
            json.dumps({"cpu_percent": 100 * cpu_s / seconds, "page_percent": 100 * page_s / seconds, "rss_mb": rss_mb})
        )
        sys.stdout.flush()
        sys.stdin.read()
    finally:
        agent.stop()


# -- the parent: cases, rounds, the browser, the requests -----------------------------------------


def prepare(folder: Path) -> Path:
    """The demo bundle installed in a state directory; returns it."""
    from agent.bundles.archive import build_bundle
    from agent.bundles.installer import InstallPolicy, install
    from agent.bundles.store import Store
    from agent.hardware.board import probe

    state = folder / "state"
    bundle = folder / "demo-1.0.0.bundle"
    build_bundle([REPO / "agent/demo/demo_detector.onnx"], bundle, name="demo", version="1.0.0", key=None)
    deployment = install(bundle, Store(state), probe(), InstallPolicy(allow_unsigned=True))
    assert deployment.state == "SUCCEEDED", deployment.error
    return state


def config(folder: Path, state: Path, case: str, port: int) -> Path:
    document: dict[str, Any] = {
        "device": {"id": "bench-1"},
        "state_dir": str(state),
        "allow_unsigned": True,
        "cameras": [{"name": "cam0", "source": "synthetic", "fps": 15, "max_fps": 10}],
        "log_level": "warning",
    }
    if case != "off":
        document["status_page"] = {"listen": f"127.0.0.1:{port}"}
    path = folder / f"{case}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def wait_for(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


def timed_requests(port: int, path: str, count: int, apart_s: float) -> list[float]:
    """Milliseconds per ``GET path`` over one keep-alive connection, `apart_s` between requests."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        samples.append((time.perf_counter() - start) * 1000)
        assert response.status == 200, (path, response.status)
        time.sleep(apart_s)
    connection.close()
    return samples


def run_case(folder: Path, state: Path, case: str, args: argparse.Namespace, last: bool) -> dict[str, Any]:
    from testkit.browser import Chromium
    from testkit.net import free_port

    from agent.web.app import SNAPSHOT_REUSE_S

    port = free_port()
    command = [sys.executable, __file__, "--child", str(config(folder, state, case, port)),
               "--warmup", str(args.warmup), "--window", str(args.window)]  # fmt: skip
    daemon = subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    browser = None
    try:
        if case != "off":
            wait_for(f"http://127.0.0.1:{port}/healthz")
        if case == "browser":
            browser = Chromium()
            page = browser.page()
            page.open(f"http://127.0.0.1:{port}/")
            page.wait_for("window.edgeAgent && window.edgeAgent.status && window.edgeAgent.history.ts.length > 1")
        assert daemon.stdout is not None
        result: dict[str, Any] = {"case": case, **json.loads(daemon.stdout.readline())}
        if case == "browser" and last:
            apart = SNAPSHOT_REUSE_S + 0.05
            result["latency_ms"] = {path: timed_requests(port, path, args.requests, apart) for path in ENDPOINTS}
    finally:
        if browser is not None:
            browser.close()
        daemon.communicate(timeout=60)  # closes stdin: the child stops its agent
    return result


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cases = {
        case: {
            key: statistics.median(r[key] for r in runs if r["case"] == case)
            for key in ("page_percent", "cpu_percent", "rss_mb")
        }
        | {"cpu_runs": [round(r["cpu_percent"], 2) for r in runs if r["case"] == case]}
        for case in CASES
    }
    latency = next(r["latency_ms"] for r in reversed(runs) if "latency_ms" in r)
    return {
        "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"load average {os.getloadavg()[1]:.1f} (5 min) at the end",
        "cases": cases,
        "process_delta_percent": cases["browser"]["cpu_percent"] - cases["off"]["cpu_percent"],
        "rss_growth_mb": cases["on"]["rss_mb"] - cases["off"]["rss_mb"],
        "rss_growth_browser_mb": cases["browser"]["rss_mb"] - cases["off"]["rss_mb"],
        "latency_ms": {
            path: {"median": statistics.median(s), "p95": statistics.quantiles(s, n=20)[18], "count": len(s)}
            for path, s in latency.items()
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before the window")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of CPU measured per run")
    parser.add_argument("--requests", type=int, default=40, help="timed requests per endpoint (1 s apart)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # internal: run one daemon
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.warmup, args.window)
        return 0
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        state = prepare(folder)
        for round_ in range(args.rounds):
            for case in CASES:
                runs.append(run_case(folder, state, case, args, last=round_ == args.rounds - 1))
                run = runs[-1]
                numbers = (
                    f"page {run['page_percent']:.2f} %, process {run['cpu_percent']:.2f} %, {run['rss_mb']:.1f} MB"
                )
                print(f"round {round_ + 1} {case}: {numbers}", file=sys.stderr)
    report = summarize(runs)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"machine: {report['machine']}")
    print("| case | page threads, % of a core | whole process, % of a core (runs) | RSS MB |\n|---|---|---|---|")
    for case, n in report["cases"].items():
        print(f"| {case} | {n['page_percent']:.2f} | {n['cpu_percent']:.2f} ({n['cpu_runs']}) | {n['rss_mb']:.1f} |")
    print(f"\nwhole process, browser - off: {report['process_delta_percent']:+.2f} %; RSS on - off "
          f"{report['rss_growth_mb']:+.1f} MB, browser - off {report['rss_growth_browser_mb']:+.1f} MB")  # fmt: skip
    print("\n| endpoint | median ms | p95 ms | requests |\n|---|---|---|---|")
    for path, n in report["latency_ms"].items():
        print(f"| `{path}` | {n['median']:.2f} | {n['p95']:.2f} | {n['count']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
