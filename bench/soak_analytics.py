"""Analytics soak: the daemon tracking objects that come and go for `--minutes`, its RSS sampled.

The agent runs as its own process against a mosquitto on a free port, with the demo bundle
installed and one camera on the tracking scene (``tracking:7`` at 15 FPS: about 12 shapes a
20 s epoch entering, crossing and leaving), a counting line, a zone, and object events with
JPEG snapshots. This script samples the agent's RSS, threads and file descriptors every 10 s
and counts the ``start`` and ``end`` events; it prints the first sample after a minute of
warm-up, the last one, the largest, and the least-squares slope of RSS over the run after the
warm-up (MB per minute; a per-track leak shows as a steady climb).

    .venv/bin/python bench/soak_analytics.py --minutes 10 [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from testkit import DEMO_MODELS
from testkit.agent_process import AgentProcess, agent_config
from testkit.broker import Broker, Watcher

from agent.bundles.archive import build_bundle
from agent.bundles.installer import InstallPolicy, install
from agent.bundles.signing import generate_keypair, load_private_key, load_public_key
from agent.bundles.store import Store
from agent.hardware.board import probe

REPO = Path(__file__).resolve().parent.parent

DEVICE = "soak-analytics"
SAMPLE_S = 10.0
WARM_UP_S = 60.0


def prepare(folder: Path, broker: Broker) -> Path:
    """The demo bundle installed in the agent's store (state under ``folder/DEVICE``), and
    its config."""
    private, public = generate_keypair(folder / "keys")
    bundle = folder / "demo-1.0.0.bundle"
    build_bundle(
        [DEMO_MODELS / "demo_detector.onnx"], bundle, name="demo", version="1.0.0", key=load_private_key(private)
    )
    policy = InstallPolicy(trusted=[load_public_key(public)])
    installed = install(bundle, Store(folder / DEVICE / "state"), probe(), policy)
    if installed.state != "SUCCEEDED":
        raise SystemExit(f"could not install the demo bundle: {installed.error}")
    camera = {
        "name": "street",
        "source": "tracking:7",
        "fps": 15,
        "lines": [{"name": "crossing", "points": [[0, 240], [640, 240]]}],
        "zones": [{"name": "left", "polygon": [[0, 0], [320, 0], [320, 480], [0, 480]]}],
        "tracker": {"lost_frames": 15},
    }
    return agent_config(
        folder,
        broker,
        DEVICE,
        public,
        operator_key=public,
        cameras=[camera],
        telemetry={"interval_s": 5.0},
        events={"min_interval_s": 2.0, "snapshots": True},
    )


def run(folder: Path, minutes: float) -> dict[str, Any]:
    broker = Broker(folder / "broker").start()
    config = prepare(folder, broker)
    watcher = Watcher(broker, [f"edge/{DEVICE}/events", f"edge/{DEVICE}/telemetry"])
    agent = AgentProcess(config).start()
    assert agent.process is not None
    process = psutil.Process(agent.process.pid)
    samples: list[tuple[float, float, int, int]] = []  # seconds since start, RSS MB, threads, fds
    began = time.monotonic()
    try:
        while (elapsed := time.monotonic() - began) < minutes * 60 + WARM_UP_S:
            memory = process.memory_info().rss / 2**20
            samples.append((elapsed, memory, process.num_threads(), process.num_fds()))
            time.sleep(SAMPLE_S)
        telemetry = watcher.json(f"edge/{DEVICE}/telemetry") or {}
    finally:
        agent.stop(60)
        events = watcher.all_json(f"edge/{DEVICE}/events")
        watcher.close()
        broker.stop()
    steady = [s for s in samples if s[0] >= WARM_UP_S]
    t, rss = np.array([s[0] for s in steady]) / 60, np.array([s[1] for s in steady])
    slope = float(np.polyfit(t, rss, 1)[0]) if len(steady) > 2 else float("nan")
    kinds = [e.get("type") for e in events]
    return {
        "minutes": minutes,
        "starts": kinds.count("start"),
        "updates": kinds.count("update"),
        "ends": kinds.count("end"),
        "fps": telemetry.get("fps"),
        "analytics": telemetry.get("analytics"),
        "rss_first_mb": round(steady[0][1], 1),
        "rss_last_mb": round(steady[-1][1], 1),
        "rss_max_mb": round(float(rss.max()), 1),
        "rss_slope_mb_per_min": round(slope, 3),
        "threads_first_last": [steady[0][2], steady[-1][2]],
        "fds_first_last": [steady[0][3], steady[-1][3]],
        "tracebacks": agent.output().count("Traceback"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long after a minute of warm-up (default 10)")
    parser.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-analytics-") as tmp:
        print(json.dumps(run(Path(tmp), args.minutes), indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
