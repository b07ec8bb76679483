"""Chaos soak: the daemon on two cameras with a real mosquitto while faults arrive on a schedule.

For `--minutes` minutes the agent runs as its own process (a synthetic camera and a looping video
file) against a mosquitto started on a free port, while this script:

- restarts the broker every minute (killed at :05, back two seconds later);
- takes the video file away for 15 s every 90 s (the camera reconnects);
- pushes a signed deployment of 1.1.0 (INT8 TFLite) every two minutes, after a warm-up
  deployment of 1.0.0 (ONNX), and sends a signed rollback command (back to 1.0.0) a minute
  after each: every push and rollback moves the cameras between runtimes;
- bursts 500 unsigned snapshot requests every minute, then asks for a signed ping.

``--pace 2`` runs that schedule twice as fast (the short form CI runs for a minute:
tests/bench/test_soak.py).

It then prints what it saw (``--json``: one object): deployments and rollbacks that ended as
intended, each of them in ``outcomes`` (when, the version, the final state and error code, and
the error's message), the agent's RSS, threads and file descriptors at the start (after the
warm-up) and at the end, the longest gap between telemetry messages outside broker outages,
and the tracebacks in the agent's log.

    .venv/bin/python bench/soak.py --minutes 10 [--json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import psutil
import yaml
from testkit import DEMO_MODELS
from testkit.agent_process import AgentProcess
from testkit.broker import Broker
from testkit.media import write_video
from testkit.net import wait_until

from agent.bundles.archive import build_bundle
from agent.bundles.signing import generate_keypair, load_private_key
from agent.config.models import MqttSection
from agent.fleet.client import FleetError, command, connect
from agent.fleet.push import follow, push
from agent.mqtt.device_documents import CameraTelemetry, DeploymentDocument, StatusDocument, TelemetryDocument
from agent.mqtt.link import Message, MqttLink
from agent.mqtt.protocol import Topics

REPO = Path(__file__).resolve().parent.parent

DEVICE = "soak"
VERSIONS = ("1.0.0", "1.1.0")  # the two bundles' versions
TICK_S = 1.0


class TelemetryClock:
    """When each telemetry message arrived, the newest one's cameras and the device's retained
    status (its own reconnecting link: the broker restarts)."""

    def __init__(self, url: str) -> None:
        self.arrivals: list[float] = []
        self.cameras: tuple[CameraTelemetry, ...] = ()
        self.state: str | None = None
        self._lock = threading.Lock()
        self.link = MqttLink(MqttSection(broker=url, reconnect_min_s=0.2, reconnect_max_s=1.0), "soak-watch")
        self.link.subscribe(Topics().telemetry(DEVICE), self._on_telemetry)
        self.link.subscribe(Topics().status(DEVICE), self._on_status)
        self.link.start()

    def _on_telemetry(self, message: Message) -> None:
        document = TelemetryDocument.read(message.payload, message.topic)
        with self._lock:
            self.arrivals.append(time.monotonic())
            if isinstance(document, TelemetryDocument):
                self.cameras = document.cameras

    def _on_status(self, message: Message) -> None:
        document = StatusDocument.read(message.payload, message.topic)
        with self._lock:
            self.state = document.state if isinstance(document, StatusDocument) else None

    def online(self) -> bool:
        with self._lock:
            return self.state == "online"

    def all_inferring(self, since: float, names: set[str]) -> bool:
        """A telemetry message that arrived after `since` shows every camera of `names` with
        frames counted and a rate above zero."""
        with self._lock:
            fresh = bool(self.arrivals) and self.arrivals[-1] > since
            running = {c.name for c in self.cameras if c.fps > 0 and c.frames > 0}
        return fresh and names <= running

    def arrived_since(self, since: float) -> bool:
        with self._lock:
            return bool(self.arrivals) and self.arrivals[-1] > since

    def max_gap(self, since: float, outages: list[tuple[float, float]]) -> float:
        """The longest gap between arrivals after `since` that overlaps no broker outage (with the
        reconnect that follows it)."""
        with self._lock:
            times = [t for t in self.arrivals if t >= since]
        gaps = [b - a for a, b in pairwise(times) if not any(a < end + 5 and b > start for start, end in outages)]
        return max(gaps, default=0.0)


def agent_stats(process: psutil.Process) -> dict[str, float]:
    return {"rss_mb": process.memory_info().rss / 2**20, "threads": process.num_threads(), "fds": process.num_fds()}


def prepare(folder: Path, broker_url: str) -> tuple[Path, list[Path], Path]:
    """Keys, two signed bundles (1.0.0 ONNX, 1.1.0 INT8 TFLite), a video, and the agent's config."""
    private, public = generate_keypair(folder / "keys")
    key = load_private_key(private)
    bundles = [folder / "demo-1.0.0.bundle", folder / "demo-1.1.0.bundle"]
    build_bundle([DEMO_MODELS / "demo_detector.onnx"], bundles[0], name="demo", version=VERSIONS[0], key=key)
    build_bundle([DEMO_MODELS / "demo_detector_int8.tflite"], bundles[1], name="demo", version=VERSIONS[1], key=key)
    video = write_video(folder / "door.avi", 60, size=(320, 240))
    config = {
        "device": {"id": DEVICE},
        "state_dir": str(folder / "state"),
        "trust_keys": [str(public)],
        "operator_keys": [str(public)],
        "mqtt": {"broker": broker_url, "reconnect_min_s": 0.2, "reconnect_max_s": 2.0},
        "cameras": [
            {"name": "yard", "source": "synthetic", "max_fps": 10},
            {"name": "door", "source": str(video), "loop": True, "max_fps": 10},
        ],
        "telemetry": {"interval_s": 2.0},
        "deployments": {"probation_s": 10, "download_timeout_s": 300},
    }
    path = folder / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, bundles, private


def slots_due(schedule: list[tuple[float, float, Callable[[], None]]], window: float) -> list[tuple[float, int, int]]:
    """Each action's slots that start within `window` seconds, as ``(at, action index, slot)``
    in the order they are due (ties: in the schedule's order)."""
    due = []
    for i, (offset, period, _) in enumerate(schedule):
        slot = 0
        while offset + slot * period < window:
            due.append((offset + slot * period, i, slot))
            slot += 1
    return sorted(due)


class Soak:
    """The soak in `folder` for `minutes`, its schedule run `pace` times faster (2: a broker
    restart every 30 s, a deployment every minute, ...; the CI's short form)."""

    def __init__(self, folder: Path, minutes: float, pace: float = 1.0) -> None:
        self.folder, self.minutes, self.pace = folder, minutes, pace
        self.broker = Broker(folder / "broker").start()
        self.config, self.bundles, self.key_path = prepare(folder, self.broker.url)
        self.key = load_private_key(self.key_path)
        self.video = Path(yaml.safe_load(self.config.read_text())["cameras"][1]["source"])
        self.outages: list[tuple[float, float]] = []
        self.counts = {"deployments_total": 0, "deployments_ok": 0, "rollbacks_total": 0, "rollbacks_ok": 0}
        self.pings_ok = 0
        self.outcomes: list[dict[str, Any]] = []  # each deployment and rollback, in order
        self.started = time.monotonic()  # reset when the faults begin

    def operator(self) -> MqttLink:
        return connect(MqttSection(broker=self.broker.url), timeout=30)

    def restart_broker(self) -> None:
        start = time.monotonic()
        self.broker.kill()
        time.sleep(2.0)
        self.broker.start()
        self.outages.append((start, time.monotonic()))

    def deploy(self, version: int) -> None:
        """Push `version` (an index into the bundles) and wait for its record to end: SUCCEEDED
        is as intended; every outcome goes into `outcomes`."""
        self.counts["deployments_total"] += 1
        outcome: dict[str, Any] = {"at_s": self._elapsed(), "action": "deploy", "version": VERSIONS[version]}
        link = self.operator()
        try:
            desired = push(
                link,
                Topics(),
                self.bundles[version],
                f"device:{DEVICE}",
                chunk_size=256 * 1024,
                key=self.key,
                allow_downgrade=True,
            )
            outcome["id"] = desired.id
            record = follow(link, Topics(), [DEVICE], desired.id, timeout=90)[DEVICE]
            if isinstance(record, DeploymentDocument):
                outcome.update(state=str(record.state), error=str(record.error.code) if record.error else None)
                if record.error is not None:
                    outcome["message"] = record.error.message
            else:
                outcome.update(state=None, error="NO_RECORD" if record is None else "UNREADABLE_RECORD")
        except FleetError as exc:
            outcome.update(state=None, error="FLEET_ERROR", message=str(exc))
        finally:
            link.stop()
        outcome["ok"] = outcome.get("state") == "SUCCEEDED"
        self.counts["deployments_ok"] += outcome["ok"]
        self.outcomes.append(outcome)

    def rollback(self) -> None:
        """A signed rollback command: an ``ok`` answer is as intended (the record it made, or its
        error code, goes into `outcomes`)."""
        self.counts["rollbacks_total"] += 1
        outcome: dict[str, Any] = {"at_s": self._elapsed(), "action": "rollback"}
        answer = self._command("rollback", timeout=90)
        if answer is None:
            outcome.update(state=None, error="NO_ANSWER")
        elif answer.get("ok"):
            result = answer["result"]
            outcome.update(state=result.get("state"), version=result.get("version"), error=None)
        else:
            outcome.update(state=None, error=answer["error"]["code"], message=answer["error"]["message"])
        outcome["ok"] = bool(answer and answer.get("ok"))
        self.counts["rollbacks_ok"] += outcome["ok"]
        self.outcomes.append(outcome)

    def _elapsed(self) -> float:
        """Seconds since the faults began (the warm-up: since the agent started)."""
        return round(time.monotonic() - self.started, 1)

    def snapshot_burst(self) -> None:
        link = self.operator()
        try:
            for _ in range(500):
                link.publish(Topics().command(DEVICE, "snapshot"), b"{}", qos=0)
        finally:
            link.stop()
        answer = self._command("ping", timeout=30)
        self.pings_ok += bool(answer and answer.get("ok"))

    def _command(self, name: str, timeout: float) -> dict[str, Any] | None:
        link = self.operator()
        try:
            answer = command(link, Topics(), [DEVICE], name, key=self.key, timeout=timeout)[DEVICE]
        except FleetError:
            return None
        finally:
            link.stop()
        return json.loads(answer[0]) if answer is not None else None

    def camera_fault(self) -> None:
        away = self.video.with_suffix(".away")
        self.video.rename(away)
        time.sleep(15 / self.pace)
        away.rename(self.video)

    @staticmethod
    def _start(threads: list[threading.Thread], target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, daemon=True)
        threads.append(thread)
        thread.start()

    def run(self) -> dict[str, Any]:
        agent = AgentProcess(self.config).start()
        self.started = time.monotonic()
        assert agent.process is not None
        process = psutil.Process(agent.process.pid)
        telemetry = TelemetryClock(self.broker.url)
        faults: list[threading.Thread] = []
        try:
            wait_until(telemetry.online, 60, "the agent online")
            self.deploy(0)  # warm-up: the first version serves, both cameras run
            deployed = time.monotonic()
            cameras = {"yard", "door"}
            wait_until(lambda: telemetry.all_inferring(deployed, cameras), 60, "both cameras inferring", 0.2)
            start, start_stats = time.monotonic(), agent_stats(process)
            self.started = start
            schedule = [  # (offset in the period, period, action), seconds at pace 1
                (5.0, 60.0, self.restart_broker),
                (30.0, 120.0, lambda: self.deploy(1)),
                (90.0, 120.0, self.rollback),
                (45.0, 90.0, lambda: self._start(faults, self.camera_fault)),
                (20.0, 60.0, self.snapshot_burst),
            ]
            schedule = [(offset / self.pace, period / self.pace, action) for offset, period, action in schedule]
            due = slots_due(schedule, self.minutes * 60)
            done: set[tuple[int, int]] = set()
            end = start + self.minutes * 60
            # every action due in the window runs, however late the ones before it made it (a
            # deployment waits for its record): what the report counts never depends on the load
            while time.monotonic() < end or len(done) < len(due):
                elapsed = time.monotonic() - start
                for at, i, slot in due:
                    if at <= elapsed and (i, slot) not in done:
                        done.add((i, slot))
                        schedule[i][2]()
                        break  # the clock moved on: look again
                else:
                    time.sleep(TICK_S)
            # the last actions settle: the camera back, and the agent reporting after them
            for fault in faults:
                fault.join()
            settled = time.monotonic()
            wait_until(lambda: telemetry.arrived_since(settled), 60, "a telemetry message after the last action", 0.2)
            end_stats = agent_stats(process)
            gap = telemetry.max_gap(start, self.outages)
        finally:
            telemetry.link.stop()
            agent.stop(60)
            self.broker.stop()
        log = agent.output()
        return {
            "minutes": self.minutes,
            **self.counts,
            "pings_ok": self.pings_ok,
            "broker_restarts": len(self.outages),
            "rss_start_mb": round(start_stats["rss_mb"], 1),
            "rss_end_mb": round(end_stats["rss_mb"], 1),
            "threads_start": start_stats["threads"],
            "threads_end": end_stats["threads"],
            "fds_start": start_stats["fds"],
            "fds_end": end_stats["fds"],
            "telemetry_gap_max_s": round(gap, 2),
            "tracebacks": log.count("Traceback"),
            "outcomes": self.outcomes,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the faults go on (default 10)")
    parser.add_argument(
        "--pace", type=float, default=1.0, help="run the schedule this many times faster (CI's short form: 2)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep", type=Path, help="keep the agent's files (log, state) in this folder")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the script's own links reconnect at every broker restart
    with tempfile.TemporaryDirectory(prefix=f"soak-{uuid.uuid4().hex[:6]}-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        report = Soak(folder, args.minutes, args.pace).run()
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:<22} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
