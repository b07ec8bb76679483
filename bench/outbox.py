#!/usr/bin/env python3
"""The durable outbox's cost (docs/benchmarks.md#outbox-writes): appends per second it sustains
and CPU per event, with ``synchronous`` ``normal`` and ``full``.

Each round appends `--messages` object events (a real `ObjectEvent` made JSON as the agent makes
it, about 450 bytes) to a fresh `agent.mqtt.outbox.Outbox` in a folder on the disk under test
(`--dir`, default the system's temp dir), one append = one committed transaction as in the
agent, and times them by the wall clock and by this process's CPU time; then the same with the
messages acknowledged (deleted) in batches of 10 as the sender does, the steady state of a
connected device. Settings alternate within each round, the order reversed every round;
the report gives each case's median over the rounds.

    .venv/bin/python bench/outbox.py [--rounds 5] [--messages 2000] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.config.models import OutboxSection  # noqa: E402
from agent.event_values import LineCrossing, ObjectEvent  # noqa: E402
from agent.mqtt.outbox import Outbox  # noqa: E402
from agent.mqtt.protocol import json_payload  # noqa: E402


def event_payload(i: int) -> bytes:
    event = ObjectEvent(
        kind="update",
        ts=1_800_000_000.0 + i,
        camera="cam0",
        object_id=f"{i:016x}",
        track_id=i,
        label="person",
        class_id=0,
        confidence=0.87,
        box=(120.5, 80.25, 220.0, 310.75),
        frame=i * 3,
        duration_s=4.2,
        zones={"bay": 3.5},
        lines=(LineCrossing("door", "forward"),),
    )
    return json_payload({"device": "bench-1", **event.to_json()})


def one(folder: Path, synchronous: str, messages: int, acked: bool) -> dict[str, float]:
    path = folder / f"outbox-{synchronous}-{acked}-{time.monotonic_ns()}.sqlite"
    outbox = Outbox(path, OutboxSection(synchronous=synchronous))  # type: ignore[arg-type]
    payloads = [event_payload(i) for i in range(messages)]
    waiting = []
    wall, cpu = time.perf_counter(), time.process_time()
    for payload in payloads:
        pending = outbox.append("event", "edge/bench-1/events", payload)
        if acked and pending is not None:
            waiting.append(pending)
            if len(waiting) == 10:
                outbox.acked(waiting)
                waiting = []
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    outbox.close()
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return {"per_s": messages / wall, "cpu_us": cpu / messages * 1e6, "wall_us": wall / messages * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cases = [(s, a) for s in ("normal", "full") for a in (False, True)]
    results: dict[str, list[dict[str, float]]] = {f"{s}{' + acks' if a else ''}": [] for s, a in cases}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for round_ in range(args.rounds):
            for synchronous, acked in cases if round_ % 2 == 0 else list(reversed(cases)):
                name = f"{synchronous}{' + acks' if acked else ''}"
                results[name].append(one(Path(tmp), synchronous, args.messages, acked))
    report: dict[str, Any] = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPU, Python {platform.python_version()}",
        "dir": str(args.dir),
        "messages": args.messages,
        "rounds": args.rounds,
        "cases": {
            name: {key: round(statistics.median(r[key] for r in runs), 1) for key in ("per_s", "cpu_us", "wall_us")}
            for name, runs in results.items()
        },
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{report['machine']}, {args.messages} appends per case, median of {args.rounds} rounds, in {args.dir}")
        print(f"{'case':<16} {'appends/s':>10} {'CPU us/event':>13} {'wall us/event':>14}")
        for name, case in report["cases"].items():
            print(f"{name:<16} {case['per_s']:>10.0f} {case['cpu_us']:>13.1f} {case['wall_us']:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
