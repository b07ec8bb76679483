"""End to end: staged rollouts over a real mosquitto (an injected clock): waves in order, a halt past the
failure limit, resume; a halt on quality (issue 38: the shadow rejects a blind version)."""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit.broker import Broker, Watcher
from testkit.fleet import cli, publish_raw
from testkit.net import wait_until

from agent.bundles.record import FINAL_STATES
from agent.daemon.simulation import FleetSettings, SimulatedFleet
from agent.mqtt.rollout_schedule import FailureLimit, Rollout
from runtimes.registry import BACKENDS

pytestmark = pytest.mark.usefixtures("operator_key")


HOUR = 3600.0


class OffsetClock:
    """The devices' wall clock: real time plus an offset the test moves (so control documents
    signed now are never from the future). It counts the reads of each deployer thread per
    offset: a deployer reads it once per look at its desired document (`looked`)."""

    def __init__(self) -> None:
        self.offset = 0.0
        self._lock = threading.Lock()
        self._reads: collections.Counter[tuple[int, float]] = collections.Counter()

    def __call__(self) -> float:
        offset = self.offset
        if threading.current_thread().name == "deployer":
            with self._lock:
                self._reads[(threading.get_ident(), offset)] += 1
        return time.time() + offset

    def looked(self, devices: int, times: int = 2) -> bool:
        """Whether `devices` deployer threads alive now have each read the clock `times` times at
        the current offset: the first read's plan was acted on (a start records the deployment
        before the deployer reads the clock again)."""
        alive = {t.ident for t in threading.enumerate() if t.name == "deployer"}
        with self._lock:
            done = [ident for (ident, offset), n in self._reads.items() if offset == self.offset and n >= times]
        return len(alive.intersection(done)) >= devices


def schedule(waves: list[float]) -> Rollout:
    return Rollout(waves=waves, start=0, interval_s=HOUR, max_failures=FailureLimit(devices=0))


def deployment_id(devices: list[str], waves: list[float], want: Any) -> str:
    """The first id ``rollout-N`` whose waves split `devices` as `want({device: wave})` asks."""
    for n in range(10_000):
        candidate = f"rollout-{n}"
        split = {d: schedule(waves).wave_of(candidate, d) for d in devices}
        if want(split):
            return candidate
    raise AssertionError("no deployment id splits the devices as wanted")


@pytest.fixture
def fleets(tmp_path: Path, broker: Broker, keys: dict[str, Path]) -> Iterator[Any]:
    """``fleets(devices, group, clock, **overrides)`` makes a `SimulatedFleet` (not started)."""
    made: list[SimulatedFleet] = []

    def make(devices: list[str], group: str, clock: OffsetClock, **overrides: Any) -> SimulatedFleet:
        overrides = {"telemetry": {"interval_s": 1.0}, **overrides}  # statuses refresh every second
        settings = FleetSettings(broker.url, group, (keys["public"],), (keys["operator_pub"],), overrides)
        made.append(SimulatedFleet(tmp_path / "devices", devices, settings, clock=clock))
        return made[-1]

    yield make
    for fleet in made:
        fleet.stop()


def records(watcher: Watcher, devices: list[str], deployment: str) -> dict[str, dict[str, Any]]:
    """The devices' deployment records of `deployment` (absent: not started)."""
    found = {d: watcher.json(f"edge/{d}/deployment") for d in devices}
    return {d: r for d, r in found.items() if r is not None and r["id"] == deployment}


def states(watcher: Watcher, devices: list[str], deployment: str) -> dict[str, str]:
    return {d: r["state"] for d, r in records(watcher, devices, deployment).items()}


def all_in(watcher: Watcher, devices: list[str], deployment: str, state: str, timeout: float = 90) -> None:
    wait_until(
        lambda: states(watcher, devices, deployment) == dict.fromkeys(devices, state),
        timeout,
        f"{devices} to be {state}: {states(watcher, devices, deployment)}",
    )


def halted_document(watcher: Watcher, group: str) -> dict[str, Any]:
    """The group's desired document once it carries the halt. The CLI that halted the rollout
    retains it as it exits; this watcher, another client, gets its copy a moment later."""
    topic = f"edge/groups/{group}/desired"
    wait_until(lambda: "halted" in watcher.json(topic)["rollout"], 30, "the halt retained")
    return watcher.json(topic)  # type: ignore[no-any-return]


def serving_format(watcher: Watcher, device: str, artifact_format: str) -> None:
    """Wait for `device`'s status to say its camera is served by a runtime that reads
    `artifact_format` ("onnx": ONNX Runtime or OpenVINO, whichever autotune found faster)."""
    readers = {name for name, backend in BACKENDS.items() if artifact_format in backend.formats}

    def runtime() -> object:
        return (watcher.json(f"edge/{device}/status") or {}).get("runtime")

    wait_until(lambda: runtime() in readers, 60, f"{device}'s camera on one of {sorted(readers)}")


def online(watcher: Watcher, devices: list[str]) -> None:
    wait_until(
        lambda: all((watcher.json(f"edge/{d}/status") or {}).get("state") == "online" for d in devices),
        60,
        f"{devices} online",
    )


@pytest.mark.long(seconds=20)
def test_waves_open_in_order_a_late_device_catches_up_and_fleet_status_shows_the_waves(
    capsys, broker: Broker, watcher: Watcher, fleets, bundles: dict[str, Path]
) -> None:
    devices = [f"cam-{i}" for i in range(8)]
    late = "cam-7"
    waves = [25.0, 60.0, 100.0]
    chosen = deployment_id(
        devices, waves, lambda s: s[late] == 1 and all(list(s.values()).count(i) >= 2 for i in range(3))
    )
    wave = {d: schedule(waves).wave_of(chosen, d) for d in devices}
    by_wave = [[d for d in devices if wave[d] == i] for i in range(3)]
    clock = OffsetClock()
    fleet = fleets(devices, "yard", clock).start([d for d in devices if d != late])
    online(watcher, [d for d in devices if d != late])

    status, out = cli(
        capsys,
        *("fleet", "push", str(bundles["v1"]), "--target", "group:yard", "--broker", broker.url),
        *("--waves", "25%,60%,100%", "--wave-interval", "1h", "--id", chosen),
    )
    assert status == 0 and f"as deployment {chosen}" in out and "waves 25%,60%,100%" in out, out
    all_in(watcher, by_wave[0], chosen, "SUCCEEDED")
    waiting = [d for d in by_wave[1] + by_wave[2] if d != late]
    assert states(watcher, waiting, chosen) == {}, "devices of later waves did not start"
    position = fleet[waiting[0]].snapshot().rollout
    assert position is not None and (position.state, position.waves) == ("waiting", 3)
    watcher.wait_json(f"edge/{waiting[0]}/status", lambda d: (d.get("rollout") or {}).get("state") == "waiting", 30)

    status, table = cli(capsys, "fleet", "status", "--broker", broker.url)
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert all("1/3 open" in rows[d] for d in by_wave[0]), table
    assert all(f"{wave[d] + 1}/3 at " in rows[d] for d in waiting), table
    status, out = cli(capsys, "fleet", "rollout", "status", chosen, "--broker", broker.url, "--json")
    tally = json.loads(out)
    assert [(w["started"], w["succeeded"]) for w in tally["waves"]] == [(len(by_wave[0]),) * 2, (0, 0), (0, 0)]

    clock.offset = HOUR  # the second wave opens; the late device is still off
    all_in(watcher, [d for d in by_wave[1] if d != late], chosen, "SUCCEEDED")
    assert states(watcher, by_wave[2], chosen) == {}, "the third wave waits for its hour"
    clock.offset = 2 * HOUR
    all_in(watcher, by_wave[2], chosen, "SUCCEEDED")

    fleet.start([late])  # back online after its wave opened: it catches up at once
    all_in(watcher, devices, chosen, "SUCCEEDED")
    status, out = cli(capsys, "fleet", "rollout", "watch", chosen, "--broker", broker.url, "--timeout", "30")
    assert status == 0 and out.startswith(f"{chosen} on group yard: complete"), out
    assert "8/8 started, 8 succeeded, 0 failed" in out, out

    status, out = cli(capsys, "fleet", "rollout", "halt", chosen, "--reason", "by hand", "--broker", broker.url)
    assert status == 0 and "devices that took it: keep" in out, out
    wait_until(lambda: "halted" in str(fleet[devices[0]].snapshot().rollout), 30, "the halt to reach the devices")
    assert states(watcher, devices, chosen) == dict.fromkeys(devices, "SUCCEEDED"), "keep: they keep it"
    status, table = cli(capsys, "fleet", "status", "--broker", broker.url)
    assert all("halted" in line for line in table.splitlines()[1:]), table


@pytest.mark.long(seconds=25)
def test_failures_past_the_limit_halt_the_rollout_roll_back_who_took_it_and_resume_continues(
    capsys, broker: Broker, watcher: Watcher, fleets, bundles: dict[str, Path]
) -> None:
    healthy = [f"ok-{i}" for i in range(6)]
    failing = ["onnx-only-0", "onnx-only-1"]  # v2 is TFLite only: NO_RUNTIME where only ONNX Runtime may run
    everyone = healthy + failing
    waves = [40.0, 100.0]

    def split(s: dict[str, int]) -> bool:
        first = [d for d in everyone if s[d] == 0]
        second = [d for d in healthy if s[d] == 1]
        return any(d in failing for d in first) and len(set(first) & set(healthy)) >= 2 and bool(second)

    chosen = deployment_id(everyone, waves, split)
    first = [d for d in healthy if schedule(waves).wave_of(chosen, d) == 0]
    second = [d for d in healthy if schedule(waves).wave_of(chosen, d) == 1]
    clock = OffsetClock()
    watched = first[0]  # with a camera: its status says which runtime, so which version, serves it
    fleet = fleets([d for d in healthy if d != watched], "line", clock).start()
    camera = [{"name": "cam0", "source": "synthetic", "max_fps": 2}]
    fleets([watched], "line", clock, cameras=camera).start()
    fleets(failing, "line", clock, runtime="onnxruntime").start()
    online(watcher, everyone)
    status, out = cli(capsys, "fleet", "push", str(bundles["v1"]), "--target", "group:line", "--broker", broker.url)
    v1 = out.split(" as deployment ")[1].split()[0]
    all_in(watcher, everyone, v1, "SUCCEEDED")
    serving_format(watcher, watched, "onnx")  # v1 is an ONNX model
    before_halt = watcher.json("edge/groups/line/desired")

    status, out = cli(
        capsys,
        *("fleet", "push", str(bundles["v2"]), "--target", "group:line", "--broker", broker.url, "--id", chosen),
        *("--waves", "40%,100%", "--wave-interval", "1h", "--max-failures", "0", "--on-halt", "rollback"),
        *("--wait", "120"),
    )
    assert status == 1 and "halted" in out and "NO_RUNTIME" not in out, out
    assert "the rollout is halted" in out and "onnx-only" in out, out
    halted = halted_document(watcher, "line")
    pushed = next(d for d in watcher.all_json("edge/groups/line/desired") if d["id"] == chosen)  # before the halt
    reason = halted["rollout"]["halted"]["reason"]
    assert halted["id"] == chosen and "started devices failed: onnx-only" in reason, halted
    assert halted["issued_at"] > before_halt["issued_at"]

    def undone(device: str) -> bool:  # rolled back, or (halted mid-download) the download ended
        record = watcher.json(f"edge/{device}/deployment")
        return record["id"] == chosen and (record["error"] or {}).get("code") == "ROLLOUT_HALTED"

    wait_until(lambda: all(undone(d) for d in first), 90, "the first wave's healthy devices to roll back")
    wait_until(
        lambda: all(
            (watcher.json(f"edge/{d}/status") or {}).get("bundle", {}).get("version") == "1.0.0" for d in first
        ),
        30,
        "v1 installed again",
    )
    serving_format(watcher, watched, "onnx")  # the camera serves v1 again, not only the pointers
    clock.offset = 2 * HOUR  # the second wave's time comes: halted, it does not start
    wait_until(lambda: clock.looked(len(everyone)), 30, "every deployer to look at the halted rollout at 2 h")
    assert states(watcher, second, chosen) == {}, "nobody starts while the rollout is halted"
    status, out = cli(capsys, "fleet", "rollout", "status", chosen, "--broker", broker.url)
    assert "halted" in out and "failed: onnx-only" in out, out

    # a client replays the document from before the halt, then a device restarts: neither opens the wave
    publish_raw(broker, [("edge/groups/line/desired", json.dumps(pushed).encode())])
    wait_until(
        lambda: "issued before" in str((watcher.json(f"edge/{second[0]}/status") or {}).get("deployment_problem")),
        30,
        "the replayed document to be refused",
    )
    fleet[second[0]].stop()
    clock.offset = 2 * HOUR + 1  # count the reads from here on
    restarted_at = time.time()
    fleets(second[:1], "line", clock).start()
    online(watcher, second[:1])

    def refused_again() -> bool:  # by the new process: it remembers the halted document it followed
        status = watcher.json(f"edge/{second[0]}/status") or {}
        return status.get("ts", 0) > restarted_at and "issued before" in str(status.get("deployment_problem"))

    wait_until(refused_again, 30, "the restarted device to refuse the replayed document")
    wait_until(lambda: clock.looked(len(everyone) - 1), 30, "every other deployer to look again")
    assert states(watcher, second, chosen) == {}, "the halt is remembered across a restart"

    status, out = cli(capsys, "fleet", "rollout", "resume", chosen, "--broker", broker.url)
    assert status == 0, out
    all_in(watcher, healthy, chosen, "SUCCEEDED")
    # a failing device of the second wave starts on the resume too: wait for its end, not for luck
    final = {state.value for state in FINAL_STATES}
    wait_until(
        lambda: all(states(watcher, failing, chosen).get(d) in final for d in failing), 90, "the failing devices to end"
    )
    ended = records(watcher, failing, chosen)
    assert {r["error"]["code"] for r in ended.values()} == {"NO_RUNTIME"}, ended
    assert all(r["attempt"] == 1 for r in ended.values()), "a device that failed by itself is not retried"
    assert all(watcher.json(f"edge/{d}/deployment")["attempt"] == 2 for d in first), "taken again after the halt"


@pytest.mark.long(seconds=35)
def test_a_rollout_whose_busy_devices_fail_on_quality_halts_and_rolls_back_who_took_it(
    capsys, tmp_path: Path, broker: Broker, watcher: Watcher, fleets, keys: dict[str, Path]
) -> None:
    """Issue 38: four devices of one group, two before a busy scene (the synthetic shapes) and two
    before an empty one (a clip of grey frames). v2 is v1's detector with every class score times
    0.2 (`altered`), pushed in two waves with a gating shadow that passes a quiet scene. The quiet
    devices (first wave) find too little to compare and take v2; the busy ones (second wave) see
    it disagree and end REJECTED with SHADOW_DISAGREES, v1 untouched. Two failures past
    --max-failures 1: the watch exits halted, the group's document says so, and --on-halt
    rollback returns the quiet devices to v1."""
    import cv2
    import numpy as np
    from testkit import DEMO_MODELS
    from testkit.bundles import bundle_of
    from testkit.onnx_models import altered

    v1 = bundle_of(DEMO_MODELS / "demo_detector.onnx", tmp_path / "v1.bundle", keys["private"], version="1.0.0")
    blind = altered(DEMO_MODELS / "demo_detector.onnx", tmp_path / "blind.onnx", score_scale=0.2)
    v2 = bundle_of(blind, tmp_path / "v2.bundle", keys["private"], version="2.0.0")
    clip = tmp_path / "empty.avi"
    writer = cv2.VideoWriter(str(clip), cv2.VideoWriter_fourcc(*"MJPG"), 10, (640, 480))
    for _ in range(50):
        writer.write(np.full((480, 640, 3), 114, np.uint8))
    writer.release()

    busy, quiet = ["busy-0", "busy-1"], ["quiet-0", "quiet-1"]
    everyone = busy + quiet
    waves = [50.0, 100.0]
    chosen = deployment_id(everyone, waves, lambda s: all(s[d] == 0 for d in quiet) and all(s[d] == 1 for d in busy))
    clock = OffsetClock()
    # a busy camera judges once it has seen enough (100 shapes take 5 s at 5 FPS); on a loaded
    # machine that takes longer, so its shadow may run on for 2 minutes; the quiet devices end
    # their quiet shadow 8 s after the switch
    scene = [{"name": "cam0", "source": "synthetic", "max_fps": 5}]
    fleets(busy, "floor", clock, cameras=scene, deployments={"probation_s": 0.0, "shadow": {"max_s": 120}}).start()
    empty = [{"name": "cam0", "source": str(clip), "max_fps": 5}]
    fleets(quiet, "floor", clock, cameras=empty, deployments={"probation_s": 0.0, "shadow": {"max_s": 8}}).start()
    online(watcher, everyone)
    status, out = cli(capsys, "fleet", "push", str(v1), "--target", "group:floor", "--broker", broker.url)
    assert status == 0, out
    all_in(watcher, everyone, out.split(" as deployment ")[1].split()[0], "SUCCEEDED")

    status, out = cli(
        capsys,
        *("fleet", "push", str(v2), "--target", "group:floor", "--broker", broker.url, "--id", chosen),
        *("--waves", "50%,100%", "--wave-interval", "1h", "--max-failures", "1", "--on-halt", "rollback"),
        *("--shadow", "5s", "--min-agreement", "0.8", "--shadow-mode", "gate", "--shadow-quiet", "pass"),
    )
    assert status == 0, out
    all_in(watcher, quiet, chosen, "SUCCEEDED")
    for device in quiet:
        record = watcher.json(f"edge/{device}/deployment")
        assert record["shadow"]["outcome"] == "quiet" and record["shadow"]["mode"] == "gate", record
    clock.offset = HOUR  # the second wave opens: the busy devices shadow v2 and see it blind

    status, out = cli(capsys, "fleet", "rollout", "watch", chosen, "--broker", broker.url, "--timeout", "180")
    assert status == 1 and "the rollout is halted" in out, out
    for device in busy:
        record = watcher.json(f"edge/{device}/deployment")
        assert (record["state"], record["error"]["code"]) == ("REJECTED", "SHADOW_DISAGREES"), record
        assert record["shadow"]["outcome"] == "disagrees" and record["shadow"]["cameras"][0]["agreement"] < 0.8
        assert (watcher.json(f"edge/{device}/status") or {})["bundle"]["version"] == "1.0.0", "v1 untouched"
    halted = halted_document(watcher, "floor")["rollout"]["halted"]
    assert "2 of 4 started devices failed: busy-0, busy-1" in halted["reason"], halted

    def undone(device: str) -> bool:
        record = watcher.json(f"edge/{device}/deployment")
        status = watcher.json(f"edge/{device}/status") or {}
        halted_back = record["id"] == chosen and (record["error"] or {}).get("code") == "ROLLOUT_HALTED"
        return halted_back and status.get("bundle", {}).get("version") == "1.0.0"

    wait_until(lambda: all(undone(d) for d in quiet), 90, "the quiet devices that took v2 to roll back to v1")
    status, out = cli(capsys, "fleet", "rollout", "status", chosen, "--broker", broker.url)
    assert "halted" in out and "failed: busy-0, busy-1" in out, out
    assert out.count("shadow disagrees") == 2 and out.count("shadow quiet") == 2, out
    status, out = cli(capsys, "fleet", "status", "--broker", broker.url)
    assert out.count("shadow disagrees") == 2, out
