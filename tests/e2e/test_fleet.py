"""End to end: a fleet of agent processes over a real mosquitto: pushes, resumes, corruption, the last
will, commands, network cuts, URL sources, SIGHUP, gc, crashes mid-install."""

from __future__ import annotations

import hashlib
import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from testkit.agent_process import AgentProcess
from testkit.broker import Broker, Watcher
from testkit.bundles import read_files, write_tar
from testkit.fleet import announce, cli, finished, online, publish_raw, push, request, serving, signed_request
from testkit.net import TcpProxy, wait_until

from agent.mqtt.protocol import ChunkIndex, Topics

pytestmark = pytest.mark.usefixtures("operator_key")


SHAPES = {"circle", "square", "triangle"}


def test_push_to_a_group_reaches_every_device_honours_overrides_and_catches_up_late_devices(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path]
) -> None:
    agents("dev1", group="lobby")
    agents("dev2", group="lobby")
    online(watcher, "dev1")
    online(watcher, "dev2")

    override = push(capsys, broker, bundles["v2"], "device:dev2")
    assert finished(watcher, "dev2", override)["state"] == "SUCCEEDED"
    group = push(capsys, broker, bundles["v1"], "group:lobby")
    record = finished(watcher, "dev1", group)
    assert record["state"] == "SUCCEEDED", record
    assert [h["state"] for h in record["history"]] == [
        "QUEUED",
        "DOWNLOADING",
        "VERIFYING",
        "INSTALLING",
        "ACTIVATING",
        "PROBATION",
        "SUCCEEDED",
    ]
    serving(watcher, "dev1", "1.0.0")
    labels = {e["label"] for e in watcher.all_json("edge/dev1/events")}
    assert labels and labels <= SHAPES, labels

    agents("dev3", group="lobby")  # was offline during the push
    assert finished(watcher, "dev3", group)["state"] == "SUCCEEDED"
    serving(watcher, "dev3", "1.0.0")

    assert watcher.json("edge/dev2/deployment")["id"] == override, "the device-level document wins"
    serving(watcher, "dev2", "1.1.0")

    status, out = cli(capsys, "fleet", "status", "--broker", broker.url, "--json")
    assert status == 0, out
    devices = json.loads(out)
    assert {d: p["status"]["bundle"]["version"] for d, p in devices.items()} == {
        "dev1": "1.0.0",
        "dev2": "1.1.0",
        "dev3": "1.0.0",
    }
    status, table = cli(capsys, "fleet", "status", "--broker", broker.url)
    lines = table.splitlines()
    assert lines[0].split()[:5] == ["DEVICE", "STATE", "GROUP", "BUNDLE", "DEPLOYMENT"]
    assert any(line.split()[:2] == ["dev2", "online"] and "1.1.0" in line for line in lines[1:]), table

    status, out = cli(capsys, "fleet", "rollback", "--target", "group:lobby", "--broker", broker.url)
    assert status == 1, "nobody has a previous version: every member answers NO_PREVIOUS"
    assert sorted(line.split(":")[0] for line in out.splitlines() if "NO_PREVIOUS" in line) == ["dev1", "dev2", "dev3"]


def start_half_download(
    capsys, broker: Broker, watcher: Watcher, agents, bundle: Path
) -> tuple[AgentProcess, str, dict[str, Any], list[tuple[str, bytes]]]:
    """`bundle` pushed to dev1 in 16 KiB chunks, then the second half of its chunks taken off the
    broker before the device starts, so its download stops midway for as long as the test needs,
    whatever the machine's speed. Returns the agent, the deployment, the progress the device
    reported with half the chunks on disk, and the chunks withheld (to publish again)."""
    deployment = push(capsys, broker, bundle, "device:dev1", "--chunk-size", "16k")
    data, topics = bundle.read_bytes(), Topics()
    index = ChunkIndex.of(data, 16384)
    half = len(index.chunks) // 2
    withheld = []
    for i in range(half, len(index.chunks)):
        start, length = index.span(i)
        withheld.append((topics.chunk(index.sha256, i), data[start : start + length]))
    publish_raw(broker, [(topic, b"") for topic, _ in withheld])  # an empty retained message clears it
    agent = agents("dev1")
    return agent, deployment, chunks_done(watcher, half), withheld


def chunks_done(watcher: Watcher, at_least: int) -> dict[str, Any]:
    record = watcher.wait_json(
        "edge/dev1/deployment", lambda d: d.get("progress", {}).get("chunks_done", 0) >= at_least, 60
    )
    return record["progress"]  # type: ignore[no-any-return]


def test_broker_killed_mid_transfer_resumes_without_fetching_finished_chunks_again(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path]
) -> None:
    pushed_at, saved = time.time(), broker.folder / "mosquitto.db"
    agent, deployment, progress, withheld = start_half_download(capsys, broker, watcher, agents, bundles["v1"])
    wait_until(lambda: saved.is_file() and saved.stat().st_mtime > pushed_at, 10, "the broker's autosave")
    assert progress["chunks_done"] < progress["chunks_total"], "half the chunks were withheld"
    watcher.close()
    broker.kill()
    broker.start()
    watcher = Watcher(broker, ["edge/#"])
    publish_raw(broker, withheld)
    try:
        record = finished(watcher, "dev1", deployment)
        assert record["state"] == "SUCCEEDED", record
        final = record["progress"]
        assert final["resumed"] == 0 and final["fetched"] == final["chunks_total"], final
        assert final["duplicates"] <= 4, f"at most the chunks in flight are received twice: {final}"
        assert "connected to" in agent.output() and "again" in agent.output()
        serving(watcher, "dev1", "1.0.0")
    finally:
        watcher.close()


def test_agent_sigkilled_mid_download_resumes_from_the_chunks_on_disk(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path]
) -> None:
    agent, deployment, progress, withheld = start_half_download(capsys, broker, watcher, agents, bundles["v1"])
    agent.kill()
    assert watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "offline", 10)
    before = progress["chunks_done"]
    assert 0 < before < progress["chunks_total"], progress
    publish_raw(broker, withheld)
    agent.start()
    record = finished(watcher, "dev1", deployment)
    assert record["state"] == "SUCCEEDED", record
    final = record["progress"]
    assert final["resumed"] >= before, final
    assert final["fetched"] == final["chunks_total"] - final["resumed"], final
    assert record["history"][0]["state"] == "QUEUED", "the record continued across the restart"
    serving(watcher, "dev1", "1.0.0")


def test_corrupt_chunk_wrong_hash_and_bad_signature_are_rejected_and_the_active_model_keeps_serving(
    tmp_path: Path, capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path], operator_key: Path
) -> None:
    agents("dev1")
    online(watcher, "dev1")
    assert finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))["state"] == "SUCCEEDED"
    v1 = serving(watcher, "dev1", "1.0.0")["bundle"]["sha256"]

    data = bundles["v2"].read_bytes()
    files = read_files(bundles["v2"])
    forged = json.loads(files["manifest.json"])
    forged["description"] = "changed after signing"
    tampered = write_tar(tmp_path / "tampered.bundle", {**files, "manifest.json": json.dumps(forged).encode()})
    cases = [
        ("CHUNK_CORRUPT", lambda: announce(data, "dev1", 65536, operator_key, bad_chunk=3)),
        ("BUNDLE_HASH_MISMATCH", lambda: announce(data, "dev1", 65536, operator_key, sha256="ab" * 32)),
        ("SIGNATURE_INVALID", lambda: (push(capsys, broker, tampered, "device:dev1"), [])),
    ]
    for code, make in cases:
        deployment, messages = make()
        publish_raw(broker, messages)
        record = finished(watcher, "dev1", deployment)
        assert (record["state"], record["error"]["code"]) == ("REJECTED", code), record
        assert record["error"]["message"]
        status = serving(watcher, "dev1", "1.0.0")
        assert status["bundle"]["sha256"] == v1

    publish_raw(broker, [("edge/dev1/desired", b'{"id": "x", "bundle": "?"}')])
    status = watcher.wait_json("edge/dev1/status", lambda d: bool(d.get("deployment_problem")), 30)
    assert "edge/dev1/desired is not a valid Desired document" in status["deployment_problem"], status
    assert status["bundle"]["sha256"] == v1, "a malformed desired document changes nothing"


def test_last_will_marks_a_killed_agent_offline_and_sigterm_stops_cleanly(
    broker: Broker, watcher: Watcher, agents
) -> None:
    agent = agents("dev1")
    online(watcher, "dev1")
    agent.kill()
    assert watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "offline", 10)

    agent.start()
    online(watcher, "dev1")
    assert agent.stop() == 0
    states = [s["state"] for s in watcher.all_json("edge/dev1/status")]
    last_run = states[len(states) - states[::-1].index("online") :]
    assert last_run[:2] == ["stopping", "offline"] and set(last_run[2:]) <= {"offline"}, states
    assert "Traceback" not in agent.output()


@pytest.mark.long(seconds=20)
def test_commands_answer_on_the_response_topic_and_bad_ones_change_nothing(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path], operator_key: Path
) -> None:
    agent = agents("dev1")
    online(watcher, "dev1")
    body = json.loads(request(broker, "dev1", "rollback", signed_request(operator_key, "dev1", "rollback"))[0])
    assert (body["ok"], body["error"]["code"]) == (False, "NO_PREVIOUS")

    finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))
    second = push(capsys, broker, bundles["v2"], "device:dev1")
    assert finished(watcher, "dev1", second)["state"] == "SUCCEEDED"
    serving(watcher, "dev1", "1.1.0")

    pong, kind = request(broker, "dev1", "ping", signed_request(operator_key, "dev1", "ping"))
    assert kind == "application/json" and json.loads(pong)["ok"] is True
    jpeg, kind = request(broker, "dev1", "snapshot", signed_request(operator_key, "dev1", "snapshot", {"quality": 70}))
    assert kind == "image/jpeg"
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape[2] == 3
    for name, payload, code in [
        ("self-destruct", b"", "UNKNOWN_COMMAND"),
        ("snapshot", b"not json", "BAD_PAYLOAD"),
        ("snapshot", signed_request(operator_key, "dev1", "snapshot", {"quality": 500}), "BAD_PAYLOAD"),
        (
            "restart-camera",
            signed_request(operator_key, "dev1", "restart-camera", {"camera": "nope"}),
            "NO_PIPELINE",
        ),
        ("rollback", signed_request(operator_key, "dev1", "rollback", {"force": True}), "BAD_PAYLOAD"),
        ("rollback", b"{}", "UNAUTHORIZED"),
    ]:
        body = json.loads(request(broker, "dev1", name, payload)[0])
        assert (body["ok"], body["error"]["code"]) == (False, code), body
    assert watcher.json("edge/dev1/status")["bundle"]["version"] == "1.1.0", "bad commands changed nothing"

    restart = signed_request(operator_key, "dev1", "restart-camera", {"camera": "cam0"})
    body = json.loads(request(broker, "dev1", "restart-camera", restart)[0])
    assert body == {"ok": True, "command": "restart-camera", "result": {"restarted": ["cam0"]}}
    old = signed_request(operator_key, "dev1", "restart-pipeline", {"pipeline": "cam0"})  # for one release
    body = json.loads(request(broker, "dev1", "restart-pipeline", old)[0])
    assert body["result"] == {"restarted": ["cam0"]} and "use restart-camera" in body["deprecated"], body

    status, out = cli(capsys, "fleet", "rollback", "--target", "device:dev1", "--broker", broker.url)
    assert status == 0 and "rolled back to demo 1.0.0" in out, out
    serving(watcher, "dev1", "1.0.0")
    assert watcher.json("edge/dev1/deployment")["state"] == "ROLLED_BACK"

    agent.stop()  # the retained desired document (1.1.0) was followed already: no reinstall on restart
    agent.start()
    online(watcher, "dev1")
    serving(watcher, "dev1", "1.0.0")  # telemetry after the restart shows 1.0.0 serving
    wait_until(lambda: "running as dev1" in agent.output().rsplit("stopped", 1)[-1], 30, "the restarted agent")
    assert "deployment " not in agent.output().rsplit("stopped", 1)[-1], "the restart deployed nothing"


def _waiting(outbox: Path, kind: str, after: float) -> int:
    """How many `kind` messages made after `after` (Unix seconds) the agent's outbox holds
    unsent (read only, beside the running agent)."""
    db = sqlite3.connect(f"{outbox.as_uri()}?mode=ro", uri=True)
    try:
        (count,) = db.execute("SELECT COUNT(*) FROM messages WHERE kind = ? AND created > ?", (kind, after)).fetchone()
    finally:
        db.close()
    return int(count)


def test_network_cut_keeps_detections_running_and_every_telemetry_summary(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path]
) -> None:
    proxy = TcpProxy(broker.port).restore()
    agent = agents("dev1", mqtt={"broker": proxy.url, "keepalive_s": 5, "offline_queue": 4})
    online(watcher, "dev1")
    finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))
    serving(watcher, "dev1", "1.0.0")

    proxy.cut()
    cut_at = time.time()
    assert watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "offline", 15), "last will on the cut"
    outbox = Path(agent.config).parent / "state" / "outbox.sqlite"
    wait_until(lambda: _waiting(outbox, "telemetry", after=cut_at + 1) >= 6, 60, "six telemetry summaries kept")
    proxy.restore()
    restored_at = time.time()
    online(watcher, "dev1", 30)
    wait_until(lambda: [t for t in watcher.all_json("edge/dev1/telemetry") if t["ts"] > restored_at], 30, "telemetry")

    telemetry = watcher.all_json("edge/dev1/telemetry")
    queued = [t for t in telemetry if cut_at + 1 < t["ts"] < restored_at]
    offsets = [round(t["ts"] - cut_at, 2) for t in telemetry]
    assert len(queued) > 4, f"the outbox keeps more than the old queue of 4: {offsets}, restored {restored_at - cut_at}"
    assert all(t["fps"] > 0 for t in queued), "detections kept running while offline"
    first = list(dict.fromkeys(t["seq"] for t in telemetry))
    assert first == sorted(first), "first arrivals in the device's order (a resend repeats its seq)"
    latest = max(telemetry, key=lambda t: t["ts"])
    assert latest["mqtt"]["dropped"] == 0 and latest["mqtt"]["reconnects"] >= 1, latest["mqtt"]
    assert latest["outbox"]["dropped"]["telemetry"] == 0, latest["outbox"]


def test_url_source_downloads_with_range_requests(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path], range_server
) -> None:
    url = range_server(bundles["v1"])
    agents("dev1")
    online(watcher, "dev1")
    deployment = push(capsys, broker, bundles["v1"], "device:dev1", "--url", url, "--chunk-size", "64k")
    record = finished(watcher, "dev1", deployment)
    assert record["state"] == "SUCCEEDED", record
    assert not [t for t in watcher.latest if "/bundles/" in t and not t.endswith("/index")], "no chunks on the broker"
    serving(watcher, "dev1", "1.0.0")


def test_sighup_reloads_a_good_config_and_keeps_the_running_one_on_a_bad_one(
    tmp_path: Path, capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path]
) -> None:
    agent = agents("dev1")
    online(watcher, "dev1")
    finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))
    serving(watcher, "dev1", "1.0.0")
    good = agent.config.read_text()

    agent.config.write_text(good + "bogus_key: 1\n")
    assert agent.process is not None
    agent.process.send_signal(signal.SIGHUP)
    wait_until(lambda: "keeping the running config" in agent.output(), 20, "the refusal in the log")
    assert "bogus_key" in agent.output()

    config = yaml.safe_load(good)
    config["cameras"].append({"name": "cam1", "source": "synthetic:7"})
    agent.config.write_text(yaml.safe_dump(config))
    agent.process.send_signal(signal.SIGHUP)
    status = watcher.wait_json("edge/dev1/status", lambda d: d["cameras"] == ["cam0", "cam1"], 30)
    assert status["bundle"]["version"] == "1.0.0"
    assert agent.alive()


def test_sighup_keeps_the_running_config_on_one_nested_too_deep_or_endless(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path], operator_key: Path
) -> None:
    """Issue 37: a SIGHUP with YAML nested 20,000 deep raised RecursionError past the reload and
    ended the daemon; one with the config linked to /dev/zero grew it to 2.8 GB before a
    MemoryError. Both are refused with the bound named, and the agent answers a signed ping on
    its running config; a good config still applies after them."""
    agent = agents("dev1")
    online(watcher, "dev1")
    finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))
    serving(watcher, "dev1", "1.0.0")
    good = agent.config.read_text()
    assert agent.process is not None
    agent.config.write_text("cameras: " + "[" * 20_000 + "]" * 20_000 + "\n")
    agent.process.send_signal(signal.SIGHUP)
    wait_until(lambda: "SIGHUP: keeping the running config" in agent.output() or not agent.alive(), 30, "the refusal")
    assert agent.alive(), agent.output()[-2000:]
    assert f"{agent.config}:1: nested deeper than" in agent.output()

    agent.config.unlink()
    agent.config.symlink_to("/dev/zero")
    agent.process.send_signal(signal.SIGHUP)
    refusal = f"SIGHUP: keeping the running config: {agent.config}: larger than the"
    wait_until(lambda: refusal in agent.output() or not agent.alive(), 30, "the refusal of /dev/zero")
    assert agent.alive(), agent.output()[-2000:]

    pong = json.loads(request(broker, "dev1", "ping", signed_request(operator_key, "dev1", "ping"))[0])
    assert pong["ok"] is True and pong["result"]["state"] == "online", pong
    assert watcher.json("edge/dev1/status")["cameras"] == ["cam0"], "the running config"
    agent.config.unlink()
    config = yaml.safe_load(good)
    config["cameras"].append({"name": "cam1", "source": "synthetic:7"})
    agent.config.write_text(yaml.safe_dump(config))
    agent.process.send_signal(signal.SIGHUP)
    watcher.wait_json("edge/dev1/status", lambda d: d["cameras"] == ["cam0", "cam1"], 30)
    assert agent.alive() and "Traceback" not in agent.output()


def test_the_example_config_runs_as_is_and_push_waits_for_the_result(
    tmp_path: Path, capsys, broker: Broker, watcher: Watcher, keys: dict[str, Path], bundles: dict[str, Path]
) -> None:
    example = ["config", "example", "--device-id", "demo-cam", "--group", "demo", "--broker", broker.url]
    status, text = cli(
        capsys,
        *example,
        "--state-dir",
        str(tmp_path / "state"),
        "--trust-key",
        str(keys["public"]),
        "--operator-key",
        str(keys["operator_pub"]),
    )
    assert status == 0
    assert "probation_s: 120" in text and "telemetry:\n  interval_s: 10\n" in text
    config = tmp_path / "agent.yaml"
    # the test waits 2 s of probation, not 120, and telemetry every second, not 10 (`serving`
    # waits for a telemetry message after the switch)
    text = text.replace("probation_s: 120", "probation_s: 2")
    config.write_text(text.replace("telemetry:\n  interval_s: 10\n", "telemetry:\n  interval_s: 1\n"))
    agent = AgentProcess(config).start()
    try:
        online(watcher, "demo-cam")
        status, out = cli(
            capsys,
            "fleet",
            "push",
            str(bundles["v1"]),
            "--target",
            "group:demo",
            "--broker",
            broker.url,
            "--wait",
            "60",
        )
        assert status == 0 and "demo-cam: SUCCEEDED" in out, out
        serving(watcher, "demo-cam", "1.0.0")
        jpeg = tmp_path / "snap.jpg"
        status, out = cli(
            capsys, "fleet", "snapshot", "--target", "device:demo-cam", "-o", str(jpeg), "--broker", broker.url
        )
        assert status == 0, out
        assert cv2.imread(str(jpeg)) is not None

        files = read_files(bundles["v2"])
        tampered = write_tar(tmp_path / "t.bundle", {**files, "manifest.json": files["manifest.json"] + b" "})
        status, out = cli(
            capsys,
            "fleet",
            "push",
            str(tampered),
            "--target",
            "device:demo-cam",
            "--broker",
            broker.url,
            "--wait",
            "60",
        )
        assert status == 1 and "demo-cam: REJECTED SIGNATURE_INVALID" in out, out
    finally:
        agent.stop()


def test_fleet_gc_removes_only_bundles_no_desired_document_names(
    capsys, broker: Broker, bundles: dict[str, Path]
) -> None:
    push(capsys, broker, bundles["v1"], "device:ghost")
    push(capsys, broker, bundles["v2"], "group:nobody")
    push(capsys, broker, bundles["v2"], "device:ghost")  # v1 is no longer wanted by anyone
    status, out = cli(capsys, "fleet", "gc", "--broker", broker.url)
    assert "every bundle on the broker is referenced" in out, "v1 was pushed just now: it is spared"
    young = ["--min-age", "0", "--broker", broker.url]
    status, out = cli(capsys, "fleet", "gc", "--dry-run", *young)
    assert status == 0 and out.count("would remove") == 1, out
    status, out = cli(capsys, "fleet", "gc", *young)
    assert status == 0 and out.count("removed bundle") == 1, out
    watcher = Watcher(broker, ["edge/bundles/+/index"])
    try:
        watcher.sync("edge/bundles/sync/index")  # every retained index has arrived
        left = {json.loads(p)["sha256"] for p in watcher.latest.values()}
    finally:
        watcher.close()
    assert left == {hashlib.sha256(bundles["v2"].read_bytes()).hexdigest()}
    status, out = cli(capsys, "fleet", "gc", *young)
    assert "every bundle on the broker is referenced" in out


@pytest.mark.parametrize(
    ("step", "state", "version"),
    [("installing", "SUCCEEDED", "1.0.0"), ("activating", "ROLLED_BACK", None)],
)
def test_a_crash_mid_install_is_retried_once_but_never_after_a_crash_while_activating(
    step: str, state: str, version: str | None, capsys, broker: Broker, watcher: Watcher, agents, bundles
) -> None:
    crashing = agents("dev1", env={"EDGE_AGENT_KILL_AT": step})
    online(watcher, "dev1")
    deployment = push(capsys, broker, bundles["v1"], "device:dev1")
    assert crashing.process is not None and crashing.process.wait(60) == -signal.SIGKILL
    restarted = AgentProcess(crashing.config).start()  # same device, without the kill hook
    try:
        record = finished(watcher, "dev1", deployment)
        assert record["state"] == state, record
        if version is None:
            assert (record["error"]["code"], record["attempt"]) == ("INTERRUPTED", 1), record
            status = online(watcher, "dev1")
            assert status["bundle"] is None
            # the deployer has acted on the desired document when it followed it: no retry comes
            followed = Path(restarted.config).parent / "state" / "followed.json"
            wait_until(lambda: followed.is_file() and deployment in followed.read_text(), 30, "the document followed")
            assert watcher.json("edge/dev1/deployment")["state"] == "ROLLED_BACK"
            after_restart = restarted.output().rsplit("recovered deployment", 1)[-1]  # one log for both runs
            assert "VERIFYING" not in after_restart, "no retry after a crash while activating"
        else:
            assert record["attempt"] == 2, record
            serving(watcher, "dev1", version)
    finally:
        restarted.stop()
