#!/usr/bin/env python3
"""Benchmark: what the status page costs the daemon (CPU, memory) and how fast ``/api/status`` answers.

One ``edge-agent run`` process per run, on the demo bundle with one synthetic camera (15 FPS,
``max_fps`` 10) and no broker, in three cases that alternate in rounds (a noisy neighbour hits
all alike):

- ``off``: no ``status_page`` in agent.yaml;
- ``on``: the page served, nobody looking;
- ``browser``: the page served and open in one headless chromium (Debian's), which polls
  ``/api/status``, ``/api/problems`` and ``/api/history`` every 2 s, the events and the log every
  5 s, and reloads the camera's annotated frame each time.

Per run: a warm-up, then the daemon's CPU time over a window (percent of one core: user +
system of its process, chromium not counted) and its RSS at the end. After the last browser
window, with the page still open, ``GET /api/status`` is timed over one keep-alive connection,
each request more than a second after the previous one, so that every answer reads the agent
anew (the page reuses a snapshot for one second); then ``/api/problems``, ``/metrics`` and the
camera's snapshot the same way, for reference.

Goals: browser - off <= 2 % of a core; ``/api/status`` <= 20 ms median; RSS on - off <= 30 MB.

Usage: python scripts/bench_status_page.py [--rounds 3] [--warmup 15] [--window 30] [--requests 40] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.bundles.archive import build_bundle  # noqa: E402
from agent.bundles.install import InstallPolicy, install  # noqa: E402
from agent.bundles.store import Store  # noqa: E402
from agent.hardware.probe import probe  # noqa: E402
from agent.web.app import SNAPSHOT_REUSE_S  # noqa: E402
from tests.browser import Chromium  # noqa: E402
from tests.mqtt_tools import free_port  # noqa: E402

CASES = ("off", "on", "browser")
ENDPOINTS = ("/api/status", "/api/problems", "/metrics", "/api/cameras/cam0/snapshot.jpg")


def prepare(folder: Path) -> Path:
    """The demo bundle installed in a state directory; returns it."""
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
        "pipelines": [{"name": "cam0", "source": "synthetic", "fps": 15, "max_fps": 10}],
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


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def timed_requests(port: int, path: str, count: int) -> list[float]:
    """Milliseconds per ``GET path`` over one keep-alive connection."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        samples.append((time.perf_counter() - start) * 1000)
        assert response.status == 200, (path, response.status)
        time.sleep(SNAPSHOT_REUSE_S + 0.05)
    connection.close()
    return samples


def run_case(folder: Path, state: Path, case: str, args: argparse.Namespace, last: bool) -> dict[str, Any]:
    port = free_port()
    command = [sys.executable, "-m", "agent.cli", "run", "--config", str(config(folder, state, case, port))]
    daemon = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    browser = None
    result: dict[str, Any] = {"case": case}
    try:
        process = psutil.Process(daemon.pid)
        if case != "off":
            wait_for(f"http://127.0.0.1:{port}/healthz")
        if case == "browser":
            browser = Chromium()
            page = browser.page()
            page.open(f"http://127.0.0.1:{port}/")
            page.wait_for("window.edgeAgent && window.edgeAgent.status && window.edgeAgent.history.ts.length > 1")
        time.sleep(args.warmup)
        cpu0, wall0 = cpu_s(process), time.monotonic()
        time.sleep(args.window)
        result["cpu_percent"] = 100 * (cpu_s(process) - cpu0) / (time.monotonic() - wall0)
        result["rss_mb"] = process.memory_info().rss / 2**20
        if case == "browser" and last:
            result["latency_ms"] = {path: timed_requests(port, path, args.requests) for path in ENDPOINTS}
    finally:
        if browser is not None:
            browser.close()
        daemon.terminate()
        daemon.wait(60)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before the window")
    parser.add_argument("--window", type=float, default=30.0, help="seconds of CPU measured per run")
    parser.add_argument("--requests", type=int, default=40, help="timed requests per endpoint (1 s apart)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        state = prepare(folder)
        for round_ in range(args.rounds):
            for case in CASES:
                runs.append(run_case(folder, state, case, args, last=round_ == args.rounds - 1))
                print(f"round {round_ + 1} {case}: {runs[-1]['cpu_percent']:.2f} % CPU, {runs[-1]['rss_mb']:.1f} MB",
                      file=sys.stderr)  # fmt: skip
    summary = {
        case: {
            "cpu_percent": statistics.median(r["cpu_percent"] for r in runs if r["case"] == case),
            "rss_mb": statistics.median(r["rss_mb"] for r in runs if r["case"] == case),
            "cpu_runs": [round(r["cpu_percent"], 2) for r in runs if r["case"] == case],
        }
        for case in CASES
    }
    latency = next(r["latency_ms"] for r in reversed(runs) if "latency_ms" in r)
    report = {
        "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs, Python {platform.python_version()}",
        "cases": summary,
        "page_cpu_percent": summary["browser"]["cpu_percent"] - summary["off"]["cpu_percent"],
        "idle_page_cpu_percent": summary["on"]["cpu_percent"] - summary["off"]["cpu_percent"],
        "rss_growth_mb": summary["on"]["rss_mb"] - summary["off"]["rss_mb"],
        "rss_growth_browser_mb": summary["browser"]["rss_mb"] - summary["off"]["rss_mb"],
        "latency_ms": {
            path: {
                "median": statistics.median(samples),
                "p95": statistics.quantiles(samples, n=20)[18],
                "count": len(samples),
            }
            for path, samples in latency.items()
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"machine: {report['machine']}")
    print("| case | CPU (% of a core), median | runs | RSS MB, median |\n|---|---|---|---|")
    for case, numbers in summary.items():
        print(f"| {case} | {numbers['cpu_percent']:.2f} | {numbers['cpu_runs']} | {numbers['rss_mb']:.1f} |")
    print(f"\npage with a browser: {report['page_cpu_percent']:+.2f} % CPU; idle page: "
          f"{report['idle_page_cpu_percent']:+.2f} %; RSS {report['rss_growth_mb']:+.1f} MB "
          f"(with a browser {report['rss_growth_browser_mb']:+.1f} MB)")  # fmt: skip
    print("\n| endpoint | median ms | p95 ms | requests |\n|---|---|---|---|")
    for path, numbers in report["latency_ms"].items():
        print(f"| `{path}` | {numbers['median']:.2f} | {numbers['p95']:.2f} | {numbers['count']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
