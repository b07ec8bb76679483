"""A simulated fleet: N device agents of the real code, one group push, and the broker's fan-out
ceiling measured in the same run.

    .venv/bin/python bench/fleet_sim.py --devices 20 [--bundle-mb 2] [--processes P] [--broker URL | --port PORT]
                                          [--state-dir /dev/shm] [--chunk-size BYTES] [--timeout 600] [--json]

Each device is the daemon's `Agent` without cameras (agent/daemon/simulation.py): its own client
id, state directory, link, deployer, transfer and store, and an activation that loads the model
and checks its parity as a device would (autotune off: on every device it would measure every
way to run the bundle, about 4 CPU-seconds each; `--agent-config '{"deployments": {"autotune":
true}}'` turns it on); `--processes` processes (default: one per 25 devices,
at most four per CPU: a model being loaded holds its process's interpreter lock, which stalls the
network threads of the devices beside it) hold them. The script starts its own mosquitto (on `--port`, or a
free port; `agent.fleet.local_broker`, so the plain install of `scripts/setup.sh` runs it, as the demo does) unless
`--broker` names one, builds a signed bundle of about `--bundle-mb` MB (the demo model plus
incompressible calibration images), waits until every device is online, pushes it to the group
with an operator's signed desired document, and waits until every device ends the deployment.
Then, side by side, it measures the broker's fan-out ceiling: as many raw paho subscribers as
devices fetching the same retained chunks with one wildcard subscription, in one process and in
one per CPU (the better of the two counts).

Printed (`--json`: one object): devices, succeeded, lost (no final state within `--timeout`),
seconds (push start to the last SUCCEEDED), throughput_mb_s (all devices' bundle bytes over the
time from the desired document to the last device's download end), ceiling_mb_s (the raw
subscribers' bytes over the time from their subscription to the last one's last chunk), their
ratio, the broker's peak RSS and CPU seconds, the device processes' CPU seconds, the medians of
each deployment phase, and when (first, median, last) the devices began and ended their downloads
and succeeded. Exit status 0 when every device SUCCEEDED.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

import numpy as np
import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from agent.bundles.archive import build_bundle
from agent.bundles.signing import generate_keypair, load_private_key
from agent.config.models import MqttSection
from agent.fleet.client import connect
from agent.fleet.local_broker import LocalBroker
from agent.fleet.push import push
from agent.mqtt.protocol import Topics

REPO = Path(__file__).resolve().parent.parent

GROUP = "sim"
FINAL = ("SUCCEEDED", "REJECTED", "FAILED", "ROLLED_BACK")
MODEL = REPO / "agent" / "demo" / "demo_detector_int8_qdq.onnx"


@contextlib.contextmanager
def own_broker(folder: Path, port: int = 0) -> Iterator[tuple[str, psutil.Process]]:
    """mosquitto on `port` (0: a free one), no persistence, as set up for a fleet: TCP_NODELAY."""
    broker = LocalBroker(folder, port, persistence=False).start()
    assert broker.process is not None
    try:
        yield broker.url, psutil.Process(broker.process.pid)
    finally:
        broker.stop()


def make_bundle(folder: Path, megabytes: float, key: Path) -> Path:
    """A signed bundle of about `megabytes` MB: the demo model and noise calibration images."""
    import cv2

    images: list[Path] = []
    out = folder / "sim.bundle"
    build_bundle([MODEL], out, name="sim", version="1.0.0", key=load_private_key(key))
    rest = megabytes * 2**20 - out.stat().st_size  # the model and its reference arrays
    if rest > 64 * 1024:
        count = math.ceil(rest / (3 * 2**20))
        side = int(math.sqrt(rest / count / 3))
        rng = np.random.default_rng(0)
        (folder / "calibration").mkdir()
        for i in range(count):
            images.append(folder / "calibration" / f"noise{i}.png")
            cv2.imwrite(str(images[-1]), rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
    build_bundle([MODEL], out, name="sim", version="1.0.0", calibration=images, key=load_private_key(key))
    return out


def run_devices(devices: list[str], root: str, settings: dict[str, Any], stop: Any, log_file: str) -> None:
    """One device process: a `SimulatedFleet` of `devices` until `stop` is set."""
    from agent.daemon.simulation import FleetSettings, SimulatedFleet

    logging.basicConfig(filename=log_file, level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    fleet = SimulatedFleet(Path(root), devices, FleetSettings(**settings)).start()
    stop.wait()
    fleet.stop()


def run_raw(port: int, count: int, sha: str, chunks: int, ready: Any, go: Any, results: Any) -> None:
    """One ceiling process: `count` plain paho clients that each fetch every retained chunk of
    `sha` through one wildcard subscription; puts (subscribed at, [each client's last chunk at],
    bytes) on `results`."""
    done, lock, finished = [], threading.Lock(), threading.Event()
    received: dict[int, int] = {}
    total = [0]
    clients = []
    for i in range(count):
        client = mqtt.Client(CallbackAPIVersion.VERSION2, f"raw-{os.getpid()}-{i}", protocol=MQTTProtocolVersion.MQTTv5)

        def on_message(client: Any, userdata: int, message: mqtt.MQTTMessage) -> None:
            if not message.topic.rsplit("/", 1)[1].isdigit():
                return
            with lock:
                received[userdata] = received.get(userdata, 0) + 1
                total[0] += len(message.payload)
                if received[userdata] == chunks:
                    done.append(time.time())
                    if len(done) == count:
                        finished.set()

        client.user_data_set(i)
        client.on_message = on_message
        client.connect("127.0.0.1", port)
        client.loop_start()
        clients.append(client)
    ready.put(os.getpid())
    go.wait()
    start = time.time()
    for client in clients:
        client.subscribe(f"edge/bundles/{sha}/+", qos=1)
    finished.wait(600)
    results.put((start, sorted(done), total[0]))
    # disconnect first: it wakes each network loop at once, where loop_stop alone waits out the
    # loop's one-second select, client after client (20 clients: 11 s)
    for client in clients:
        client.disconnect()
    for client in clients:
        client.loop_stop()


class Records:
    """The devices' statuses and deployment records, as a plain paho client sees them. A broker
    drops messages for a client that falls too far behind (mosquitto's `max_queued_messages`),
    so `wait` subscribes again every few seconds: the retained records then arrive anew."""

    FILTERS: ClassVar[list[tuple[str, int]]] = [("edge/+/status", 1), ("edge/+/deployment", 1)]

    def __init__(self, port: int) -> None:
        self.online: set[str] = set()
        self.records: dict[str, dict[str, Any]] = {}
        self.changed = threading.Condition()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe(self.FILTERS)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        device, leaf = message.topic.split("/")[1:3]
        document = json.loads(message.payload) if message.payload else {}
        with self.changed:
            if leaf == "status":
                (self.online.add if document.get("state") == "online" else self.online.discard)(device)
            else:
                self.records[device] = document
            self.changed.notify_all()

    def wait(self, predicate: Any, timeout: float, refresh_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        refresh = time.monotonic() + refresh_s
        with self.changed:
            while not predicate():
                now = time.monotonic()
                if now >= deadline:
                    return False
                if now >= refresh:
                    self.client.subscribe(self.FILTERS)  # the retained records again
                    refresh = now + refresh_s
                self.changed.wait(max(0.0, min(1.0, deadline - now)))
            return True

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


class Sampler:
    """The broker's peak RSS, sampled every 0.2 s while it runs."""

    def __init__(self, process: psutil.Process | None) -> None:
        self.process, self.peak = process, 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while self.process is not None and not self._stop.wait(0.2):
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.process.memory_info().rss)

    def cpu(self) -> float:
        if self.process is None:
            return math.nan
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def stop(self) -> None:
        self._stop.set()


def processes_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def phases(records: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Medians over the devices that succeeded of the time in each state (seconds)."""
    spans: dict[str, list[float]] = {}
    for record in records.values():
        if record.get("state") != "SUCCEEDED":
            continue
        history = [(h["state"], h["ts"]) for h in record["history"]]
        for (state, ts), (_, after) in itertools.pairwise(history):
            spans.setdefault(state.lower() + "_s", []).append(after - ts)
    return {name: round(statistics.median(values), 3) for name, values in spans.items()}


def timeline(records: dict[str, dict[str, Any]], since: float) -> dict[str, list[float]]:
    """First, median and last time (seconds after `since`) the succeeded devices entered
    DOWNLOADING, VERIFYING (the download done) and SUCCEEDED."""
    found: dict[str, list[float]] = {}
    for record in records.values():
        if record.get("state") == "SUCCEEDED":
            for h in record["history"]:
                found.setdefault(h["state"], []).append(h["ts"] - since)
    return {
        state.lower(): [round(min(ts), 3), round(statistics.median(ts), 3), round(max(ts), 3)]
        for state, ts in found.items()
        if state in ("DOWNLOADING", "VERIFYING", "SUCCEEDED")
    }


def measure_ceiling(port: int, devices: int, processes: int, sha: str, chunks: int) -> tuple[float, float, int]:
    """(seconds, MB/s, bytes) of `devices` raw subscribers in `processes` processes fetching
    every retained chunk of `sha`."""
    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    shares = [len(part) for part in np.array_split(np.arange(devices), processes) if len(part)]
    workers = [context.Process(target=run_raw, args=(port, n, sha, chunks, ready, go, results)) for n in shares]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get(timeout=120)
    go.set()
    outcomes = [results.get(timeout=900) for _ in workers]
    for worker in workers:
        worker.join(30)
    start = min(o[0] for o in outcomes)
    ends = [t for o in outcomes for t in o[1]]
    received = sum(o[2] for o in outcomes)
    if len(ends) < devices:
        raise SystemExit(f"only {len(ends)} of {devices} raw subscribers received every chunk")
    seconds = max(ends) - start
    return seconds, received / 2**20 / seconds, received


def simulate(args: argparse.Namespace, folder: Path, url: str, broker: psutil.Process | None) -> dict[str, Any]:
    bundle_key, bundle_pub = generate_keypair(folder / "bundle-key")
    operator_key, operator_pub = generate_keypair(folder / "operator-key")
    bundle = make_bundle(folder, args.bundle_mb, bundle_key)
    size = bundle.stat().st_size
    names = [f"sim-{i:04d}" for i in range(args.devices)]
    processes = args.processes or max(1, min(4 * (os.cpu_count() or 1), math.ceil(args.devices / 25)))
    settings = {
        "broker": url,
        "group": GROUP,
        "trust_keys": (str(bundle_pub),),
        "operator_keys": (str(operator_pub),),
        "overrides": json.loads(args.agent_config) if args.agent_config else {},
    }
    port = urlparse(url).port or 1883
    records = Records(port)
    sampler = Sampler(broker)
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    root = (
        Path(tempfile.mkdtemp(prefix="fleet-sim-devices-", dir=args.state_dir))
        if args.state_dir
        else folder / "devices"
    )
    workers = [
        context.Process(
            target=run_devices,
            args=(list(part), str(root), settings, stop, str(folder / f"worker-{i}.log")),
        )
        for i, part in enumerate(np.array_split(np.array(names), processes))
        if len(part)
    ]
    for worker in workers:
        worker.start()
    try:
        if not records.wait(lambda: records.online >= set(names), args.timeout):
            print(f"only {len(records.online & set(names))} of {len(names)} devices came online", file=sys.stderr)
        link = connect(MqttSection(broker=url))
        try:
            cpu_before, workers_before = sampler.cpu(), processes_cpu([w.pid for w in workers if w.pid])
            started = time.time()
            desired = push(
                link, Topics(), bundle, f"group:{GROUP}", chunk_size=args.chunk_size, key=load_private_key(operator_key)
            )
            published = time.time()
        finally:
            link.stop()

        def ended() -> bool:
            return all(
                records.records.get(d, {}).get("id") == desired.id and records.records[d].get("state") in FINAL
                for d in names
            )

        records.wait(ended, args.timeout)
        broker_cpu = sampler.cpu() - cpu_before
        devices_cpu = processes_cpu([w.pid for w in workers if w.pid]) - workers_before
        with records.changed:
            mine = {d: r for d, r in records.records.items() if r.get("id") == desired.id}
        succeeded = {d: r for d, r in mine.items() if r.get("state") == "SUCCEEDED"}
        history = [{h["state"]: h["ts"] for h in r["history"]} for r in succeeded.values()]
        last_success = max((h["SUCCEEDED"] for h in history), default=math.nan)
        last_download = max((h["VERIFYING"] for h in history), default=math.nan)
        ceiling: tuple[float, float, float, int] | None = None  # seconds, MB/s, broker CPU s, processes
        for count in sorted({1, os.cpu_count() or 1}):  # the better of one process and one per CPU
            before = sampler.cpu()
            seconds, rate, _ = measure_ceiling(port, args.devices, count, desired.sha256, desired.chunks)
            if ceiling is None or rate > ceiling[1]:
                ceiling = (seconds, rate, sampler.cpu() - before, count)
        assert ceiling is not None
        ceiling_s, ceiling_mb_s, cpu_ceiling, ceiling_processes = ceiling
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
        records.close()
        sampler.stop()
        if args.state_dir:
            shutil.rmtree(root, ignore_errors=True)
    download_s = last_download - published
    throughput = len(succeeded) * size / 2**20 / download_s if succeeded else 0.0
    return {
        "devices": args.devices,
        "succeeded": len(succeeded),
        "lost": args.devices - len(mine.keys() & {d for d, r in mine.items() if r.get("state") in FINAL}),
        "failed": {d: r.get("error") for d, r in mine.items() if r.get("state") in FINAL and r["state"] != "SUCCEEDED"},
        "seconds": round(last_success - started, 3),
        "push_s": round(published - started, 3),
        "download_s": round(download_s, 3),
        "throughput_mb_s": round(throughput, 2),
        "ceiling_mb_s": round(ceiling_mb_s, 2),
        "ceiling_s": round(ceiling_s, 3),
        "ratio": round(throughput / ceiling_mb_s, 3),
        "bundle_mb": round(size / 2**20, 2),
        "chunk_size": desired.chunk_size,
        "processes": processes,
        "ceiling_processes": ceiling_processes,
        "state_dir": str(args.state_dir or "work folder"),
        "agent_config": settings["overrides"],
        "broker_rss_mb": round(sampler.peak / 2**20, 1) if broker is not None else None,
        "broker_cpu_s": round(broker_cpu, 2),
        "broker_cpu_s_ceiling": round(cpu_ceiling, 2),
        "devices_cpu_s": round(devices_cpu, 2),
        "phases": phases(mine),
        "timeline": timeline(mine, published),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=20, help="simulated devices (default 20)")
    parser.add_argument(
        "--processes", type=int, help="processes holding them (default: one per 25 devices, at most four per CPU)"
    )
    parser.add_argument("--broker", help="mqtt://HOST:PORT of a broker to use (default: start mosquitto here)")
    parser.add_argument(
        "--port", type=int, default=0, help="the port of the mosquitto it starts (default 0: a free one)"
    )
    parser.add_argument("--bundle-mb", type=float, default=2.0, help="size of the pushed bundle in MB (default 2)")
    parser.add_argument("--chunk-size", type=int, help="bytes per chunk (default: fleet push's)")
    parser.add_argument("--timeout", type=float, default=600.0, help="longest wait for the devices, seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--agent-config",
        metavar="JSON",
        help='agent.yaml sections over the simulated devices\' defaults, e.g. \'{"deployments": {"window": 32}}\'',
    )
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (state, logs, bundle)")
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="make the devices' state directories under this folder (e.g. /dev/shm: a disk of their own each, "
        "as real devices have, instead of all on this machine's one disk); removed at the end",
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-sim-")))
        folder.mkdir(parents=True, exist_ok=True)
        if args.broker:
            result = simulate(args, folder, args.broker, None)
        else:
            url, broker = stack.enter_context(own_broker(folder, args.port))
            result = simulate(args, folder, url, broker)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0 if result["succeeded"] == result["devices"] else 1


if __name__ == "__main__":
    sys.exit(main())
