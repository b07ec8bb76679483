"""Benchmark: a group push to a simulated fleet at several sizes, one after another in one run.

Runs bench/fleet_sim.py once per fleet size (each with its own mosquitto, its own bundle and
its own fan-out ceiling measured in the same run), prints a Markdown table for docs/benchmarks.md
and, with `--plot`, draws time to the last SUCCEEDED, download throughput and the ceiling against
the fleet size (matplotlib, a benchmark-only tool: `.venv/bin/pip install matplotlib`).

    .venv/bin/python bench/fleet_sizes.py --devices 25,50,100,200 --bundle-mb 10 \\
        --state-dir /dev/shm [--plot docs/fleet-sim.svg] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
COLUMNS = [
    ("devices", "devices"),
    ("succeeded", "SUCCEEDED"),
    ("lost", "lost"),
    ("seconds", "to last SUCCEEDED (s)"),
    ("download_s", "download window (s)"),
    ("throughput_mb_s", "download MB/s"),
    ("ceiling_mb_s", "ceiling MB/s"),
    ("ratio", "ratio"),
    ("broker_rss_mb", "broker peak RSS (MB)"),
    ("broker_cpu_s", "broker CPU (s)"),
    ("devices_cpu_s", "devices CPU (s)"),
    ("processes", "processes"),
]


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(title for _, title in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(key)) for key, _ in COLUMNS) + " |" for r in results]
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = [r["devices"] for r in results]
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(devices, [r["seconds"] for r in results], "o-", label="push to last SUCCEEDED")
    left.plot(devices, [r["download_s"] for r in results], "s-", label="push to last download done")
    left.set(xlabel="simulated devices", ylabel="seconds", title=f"{results[0]['bundle_mb']} MB bundle")
    right.plot(devices, [r["throughput_mb_s"] for r in results], "o-", label="devices' download")
    right.plot(devices, [r["ceiling_mb_s"] for r in results], "s--", label="raw fan-out ceiling")
    right.set(xlabel="simulated devices", ylabel="MB/s (all devices together)", title="aggregate throughput")
    for axes in (left, right):
        axes.set_xscale("log", base=2)
        axes.set_xticks(devices, [str(d) for d in devices])
        axes.grid(True, alpha=0.3)
        axes.legend()
    figure.tight_layout()
    figure.savefig(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="25,50,100,200", help="fleet sizes, comma-separated")
    parser.add_argument("--bundle-mb", type=float, default=10.0)
    parser.add_argument("--state-dir", help="passed to fleet_sim.py (e.g. /dev/shm)")
    parser.add_argument("--plot", type=Path, help="write the plot here (.svg or .png)")
    parser.add_argument("--json", type=Path, help="write every run's result here")
    args = parser.parse_args()
    results = []
    for count in (int(n) for n in args.devices.split(",")):
        command = [sys.executable, str(REPO / "bench" / "fleet_sim.py"), "--devices", str(count), "--json"]
        command += ["--bundle-mb", str(args.bundle_mb), "--timeout", "900"]
        if args.state_dir:
            command += ["--state-dir", args.state_dir]
        print("running", " ".join(command[1:]), flush=True)
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if not done.stdout.strip():
            print(done.stderr, file=sys.stderr)
            return 1
        results.append(json.loads(done.stdout.splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    print()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.plot:
        plot(results, args.plot)
        print(f"\nwrote {args.plot}")
    return 0 if all(r["succeeded"] == r["devices"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
