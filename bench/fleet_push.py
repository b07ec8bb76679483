"""Benchmark: a large bundle from `fleet push` to verified on a device, over loopback mosquitto.

Starts mosquitto on a free port and one agent process, builds two signed ~50 MB bundles (the demo
model plus incompressible calibration images), then alternately pushes them. For each push it
reports the time from the start of the push to the device's VERIFYING -> INSTALLING step (the
bundle downloaded, its whole-file hash, manifest, signature and file hashes checked),
and, side by side in the same run, a raw paho publish of 20 MB retained at QoS 1 as the
broker's ceiling.

    .venv/bin/python bench/fleet_push.py [--size-mb 50] [--rounds 3] [--chunk-size 262144]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from agent.bundles.archive import build_bundle
from agent.bundles.signing import generate_keypair, load_private_key
from agent.config.models import MqttSection
from agent.fleet.client import connect
from agent.fleet.local_broker import LocalBroker
from agent.fleet.push import push
from agent.mqtt.protocol import Topics

REPO = Path(__file__).resolve().parent.parent


def make_bundles(folder: Path, size_mb: int, key: Path) -> list[Path]:
    import cv2

    rng = np.random.default_rng(0)
    calibration = folder / "calibration"
    calibration.mkdir()
    side = 2048
    count = max(1, round(size_mb * 2**20 / (side * side * 3)))
    for i in range(count):
        cv2.imwrite(str(calibration / f"noise{i}.png"), rng.integers(0, 256, (side, side, 3), dtype=np.uint8))
    images = sorted(calibration.iterdir())
    model = REPO / "agent" / "demo" / "demo_detector.onnx"
    bundles = []
    for version in ("2.0.0", "2.0.1"):
        out = folder / f"big-{version}.bundle"
        build_bundle([model], out, name="big", version=version, calibration=images, key=load_private_key(key))
        bundles.append(out)
    return bundles


class Watch:
    def __init__(self, port: int, topic: str) -> None:
        self.topic, self.latest, self.changed = topic, {}, threading.Condition()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe(topic, qos=1)
        self.client.loop_start()

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self.changed:
            self.latest = json.loads(message.payload) if message.payload else {}
            self.latest["_received"] = time.time()
            self.changed.notify_all()

    def wait(self, predicate: Any, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate(self.latest):
                if not self.changed.wait(max(0.0, deadline - time.monotonic())):
                    raise SystemExit(f"timed out waiting on {self.topic}: {self.latest}")
            return dict(self.latest)


def raw_publish(port: int, megabytes: int = 20, chunk: int = 256 * 1024) -> float:
    """Seconds to publish `megabytes` retained QoS 1 with plain paho (all acknowledged)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
    client.max_inflight_messages_set(64)
    client.connect("127.0.0.1", port)
    client.loop_start()
    payload = os.urandom(chunk)
    start = time.perf_counter()
    infos = [client.publish(f"raw/{i}", payload, qos=1, retain=True) for i in range(megabytes * 2**20 // chunk)]
    for info in infos:
        info.wait_for_publish()
    elapsed = time.perf_counter() - start
    for i in range(len(infos)):
        client.publish(f"raw/{i}", b"", qos=1, retain=True)
    client.loop_stop()
    client.disconnect()
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    parser.add_argument("--chunk-size", type=int, default=256 * 1024)
    parser.add_argument("--window", type=int, default=16, help="the agent's deployments.window")
    parser.add_argument(
        "--broker-nagle", action="store_true", help="leave mosquitto's set_tcp_nodelay at its default (false)"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        folder = Path(tmp)
        private, public = generate_keypair(folder / "keys")
        print("building bundles ...", flush=True)
        bundles = make_bundles(folder, args.size_mb, private)
        broker = LocalBroker(folder / "broker", persistence=False, nodelay=not args.broker_nagle).start()
        port = broker.port
        config = folder / "agent.yaml"
        config.write_text(
            json.dumps(
                {
                    "device": {"id": "bench"},
                    "state_dir": str(folder / "state"),
                    "trust_keys": [str(public)],
                    "operator_keys": [str(public)],  # one key signs bundles and control here
                    "mqtt": {"broker": f"mqtt://127.0.0.1:{port}"},
                    "cameras": [],
                    "deployments": {"window": args.window, "probation_s": 0},  # transfer, not probation
                }
            )
        )
        agent = subprocess.Popen(
            [sys.executable, "-m", "agent.cli", "run", "--config", str(config)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=(folder / "agent.log").open("wb"),
        )
        watch = Watch(port, "edge/bench/deployment")
        link = connect(MqttSection(broker=f"mqtt://127.0.0.1:{port}"))
        rows = []
        try:
            time.sleep(3)  # the agent connects and subscribes
            for round_ in range(args.warmup + args.rounds):
                bundle = bundles[round_ % 2]
                size = bundle.stat().st_size
                raw = raw_publish(port)
                start = time.time()
                desired = push(
                    link, Topics(), bundle, "device:bench", chunk_size=args.chunk_size, key=load_private_key(private)
                )
                pushed = time.time()
                record = watch.wait(
                    lambda d, i=desired.id: d.get("id") == i and d.get("state") in ("INSTALLING", "REJECTED")
                )
                verified = record["_received"]
                final = watch.wait(lambda d, i=desired.id: d.get("id") == i and d.get("state") == "SUCCEEDED")
                history = {state: ts for state, ts in ((h["state"], h["ts"]) for h in final["history"])}
                row = {
                    "bundle_mb": size / 2**20,
                    "push_s": pushed - start,
                    "to_verified_s": verified - start,
                    "mb_per_s": size / 2**20 / (verified - start),
                    "download_s": history["VERIFYING"] - history["DOWNLOADING"],
                    "verify_s": history["INSTALLING"] - history["VERIFYING"],
                    "to_succeeded_s": history["SUCCEEDED"] - start,
                    "raw_20mb_s": raw,
                    "raw_mb_per_s": 20 / raw,
                }
                if round_ >= args.warmup:
                    rows.append(row)
                print("warm-up" if round_ < args.warmup else "", json.dumps({k: round(v, 3) for k, v in row.items()}))
                print("   ", {state: round(ts - start, 3) for state, ts in history.items()})
        finally:
            link.stop()
            agent.terminate()
            agent.wait(30)
            broker.stop()
    print(
        f"\n{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"chunk size {args.chunk_size}, window {args.window}, broker set_tcp_nodelay {not args.broker_nagle}, "
        f"{len(rows)} rounds after {args.warmup} warm-up"
    )
    for key in ("bundle_mb", "push_s", "download_s", "verify_s", "to_verified_s", "mb_per_s", "raw_mb_per_s"):
        print(f"  median {key:<14} {statistics.median(r[key] for r in rows):8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
