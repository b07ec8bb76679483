"""Benchmark: the device's download path alone against raw paho subscribers, side by side.

One process, one local mosquitto, one bundle's chunks retained on it. In turn, round after round:
N `MqttLink`s each running the device's own `fetch_over_mqtt` into a `PartialBundle` (chunks
queued by paho's thread, written and hashed by a downloading thread, the whole file checked at
the end), and N plain paho clients that only count the chunks. Both subscribe to the chunks with
one wildcard at QoS 1. This isolates the download from the rest of a deployment (unpacking,
activation), which bench/fleet_sim.py measures together.

    .venv/bin/python bench/fleet_download.py [--devices 50] [--mb 10] [--rounds 5] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from agent.config.models import MqttSection
from agent.deployment.transfer import PartialBundle, fetch_over_mqtt
from agent.fleet.local_broker import LocalBroker
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import ChunkIndex, Topics

REPO = Path(__file__).resolve().parent.parent


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw(port: int, index: ChunkIndex, devices: int) -> tuple[float, float]:
    """(seconds, CPU seconds) for `devices` plain paho clients to receive every chunk."""
    ends: list[float] = []
    lock, counts = threading.Lock(), dict.fromkeys(range(devices), 0)
    clients = []
    for k in range(devices):
        client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5, userdata=k)

        def on_message(client: Any, userdata: int, message: mqtt.MQTTMessage) -> None:
            if message.topic.rsplit("/", 1)[1].isdigit():
                with lock:
                    counts[userdata] += 1
                    if counts[userdata] == len(index.chunks):
                        ends.append(time.monotonic())

        client.on_message = on_message
        client.connect("127.0.0.1", port)
        client.loop_start()
        clients.append(client)
    time.sleep(1.0)
    start, before = time.monotonic(), cpu()
    for client in clients:
        client.subscribe(f"edge/bundles/{index.sha256}/+", qos=1)
    while len(ends) < devices:
        time.sleep(0.005)
    result = max(ends) - start, cpu() - before
    for client in clients:
        client.loop_stop()
        client.disconnect()
    return result


def device(port: int, index: ChunkIndex, devices: int, folder: Path) -> tuple[float, float]:
    """(seconds, CPU seconds) for `devices` device download paths to store and check the bundle."""
    links = [MqttLink(MqttSection(broker=f"mqtt://127.0.0.1:{port}"), f"bench-{k}").start() for k in range(devices)]
    for link in links:
        link.wait_connected(10)
    time.sleep(1.0)
    cancel, ends = threading.Event(), []

    def download(k: int) -> None:
        partial = PartialBundle(folder / f"d{k}", index).open()
        fetch_over_mqtt(
            links[k],
            Topics(),
            partial,
            window=16,
            max_rate=0,
            stall_timeout=60,
            cancel=cancel,
            progress=lambda done, total: None,
        )
        partial.finish()
        ends.append(time.monotonic())

    threads = [threading.Thread(target=download, args=(k,)) for k in range(devices)]
    start, before = time.monotonic(), cpu()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = max(ends) - start, cpu() - before
    for link in links:
        link.stop()
    shutil.rmtree(folder, ignore_errors=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=50)
    parser.add_argument("--mb", type=int, default=10, help="bundle size in MiB (random bytes)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where the downloads go (default: the system's temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-download-") as tmp:
        broker = LocalBroker(Path(tmp) / "broker", persistence=False).start()
        port = broker.port
        data = os.urandom(args.mb * 2**20)
        index = ChunkIndex.of(data)
        publisher = MqttLink(MqttSection(broker=f"mqtt://127.0.0.1:{port}"), "bench-publisher").start()
        publisher.wait_connected(10)
        deliveries = [
            publisher.publish(Topics().chunk(index.sha256, i), data[slice(*_range(index, i))], qos=1, retain=True)
            for i in range(len(index.chunks))
        ]
        for delivery in deliveries:
            assert delivery is not None and delivery.wait(30)
        rows: dict[str, list[tuple[float, float]]] = {"raw": [], "device": []}
        try:
            for round_ in range(args.rounds):
                order = ("raw", "device") if round_ % 2 == 0 else ("device", "raw")
                for name in order:
                    folder = Path(tempfile.mkdtemp(prefix="bench-download-", dir=args.dir))
                    seconds, used = (
                        raw(port, index, args.devices) if name == "raw" else device(port, index, args.devices, folder)
                    )
                    shutil.rmtree(folder, ignore_errors=True)
                    rows[name].append((seconds, used))
                    mb_s = args.devices * args.mb / seconds
                    print(f"round {round_ + 1} {name:>6}: {seconds:6.2f} s  {mb_s:7.1f} MB/s  CPU {used:5.2f} s")
        finally:
            publisher.stop()
            broker.stop()
    medians = {name: statistics.median(args.devices * args.mb / s for s, _ in values) for name, values in rows.items()}
    paired = statistics.median(r[0] / d[0] for r, d in zip(rows["raw"], rows["device"], strict=True))
    print(
        f"\n{args.devices} downloads of {args.mb} MiB, {args.rounds} rounds: median raw {medians['raw']:.1f} MB/s, "
        f"device path {medians['device']:.1f} MB/s; device/raw (paired median) {paired:.3f}; CPU per download: "
        f"raw {statistics.median(c for _, c in rows['raw']) / args.devices * 1000:.1f} ms, device "
        f"{statistics.median(c for _, c in rows['device']) / args.devices * 1000:.1f} ms"
    )
    return 0


def _range(index: ChunkIndex, i: int) -> tuple[int, int]:
    start, length = index.span(i)
    return start, start + length


if __name__ == "__main__":
    sys.exit(main())
