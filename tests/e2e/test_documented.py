"""End to end: what docs/mqtt.md and docs/security.md promise, over a real mosquitto and agent processes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import cv2
import pytest
from testkit.broker import Broker, Watcher
from testkit.control import newer_protocol
from testkit.fleet import cli, finished, online, publish_raw, push, request, serving, signed_request
from testkit.media import write_video
from testkit.net import wait_until

from agent import __version__ as AGENT_VERSION
from agent.bundles.signing import load_private_key
from agent.mqtt.control import sign
from agent.mqtt.protocol import PROTOCOL, ChunkIndex, Desired, Topics

pytestmark = pytest.mark.usefixtures("operator_key")


def answer(broker: Broker, device: str, name: str, key: Path, args: dict[str, object] | None = None) -> dict:  # type: ignore[type-arg]
    return json.loads(request(broker, device, name, signed_request(key, device, name, args))[0])  # type: ignore[no-any-return]


def test_an_index_that_does_not_match_the_desired_document_is_refused(
    broker: Broker, watcher: Watcher, agents, bundles, operator_key: Path
) -> None:
    """INDEX_MISMATCH: the chunk index on the broker is checked against the signed desired document
    (and waited past for the stall timeout, in case the right one comes)."""
    agents("dev1", deployments={"stall_timeout_s": 1})
    online(watcher, "dev1")
    data = bundles["v1"].read_bytes()
    index = ChunkIndex.of(data, 64 * 1024)
    desired = Desired(
        id="mismatch",
        name="demo",
        version="1.0.0",
        sha256=index.sha256,
        size=index.size,
        chunk_size=128 * 1024,  # the index says 64 KiB
        chunks=-(-index.size // (128 * 1024)),
    )
    desired = sign(desired, load_private_key(operator_key), "device:dev1")
    publish_raw(broker, [(Topics().index(index.sha256), index.to_bytes()), ("edge/dev1/desired", desired.to_bytes())])
    record = finished(watcher, "dev1", "mismatch")
    assert (record["state"], record["error"]["code"]) == ("REJECTED", "INDEX_MISMATCH"), record


def test_commands_as_documented(
    tmp_path: Path, capsys, broker: Broker, watcher: Watcher, agents, bundles, operator_key
):  # type: ignore[no-untyped-def]
    """ping answers {"pong", "state"}; snapshot before a frame is NO_FRAME; restart-camera without
    arguments restarts every camera; snapshot --camera picks the camera."""
    clip = write_video(tmp_path / "small.avi", 40, size=(160, 120))
    cameras = [
        {"name": "wide", "source": "synthetic", "max_fps": 10},
        {"name": "small", "source": str(clip), "max_fps": 10},
        {"name": "lost", "source": str(tmp_path / "not-there.avi")},
    ]
    agents("dev1", cameras=cameras)
    online(watcher, "dev1")
    finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))
    serving(watcher, "dev1", "1.0.0")

    pong = answer(broker, "dev1", "ping", operator_key)
    assert set(pong["result"]) == {"pong", "state"} and pong["result"]["state"] == "online"
    assert abs(pong["result"]["pong"] - time.time()) < 60

    no_frame = answer(broker, "dev1", "snapshot", operator_key, {"camera": "lost"})
    assert no_frame["error"]["code"] == "NO_FRAME", no_frame

    restarted = answer(broker, "dev1", "restart-camera", operator_key)
    assert restarted == {"ok": True, "command": "restart-camera", "result": {"restarted": ["wide", "small", "lost"]}}

    jpeg = tmp_path / "small.jpg"
    wait_until(
        lambda: (
            cli(
                capsys,
                "fleet",
                "snapshot",
                "--target",
                "device:dev1",
                "--camera",
                "small",
                "-o",
                str(jpeg),
                "--broker",
                broker.url,
            )[0]
            == 0
        ),
        30,
        "a snapshot of the small camera",
    )
    image = cv2.imread(str(jpeg))
    assert image is not None and image.shape[:2] == (120, 160), "the snapshot of the camera asked for"


def test_a_release_hands_the_device_back_to_its_group(
    capsys, broker: Broker, watcher: Watcher, agents, bundles
) -> None:
    agents("dev1", group="lobby")
    online(watcher, "dev1")
    assert finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "group:lobby"))["state"] == "SUCCEEDED"
    assert finished(watcher, "dev1", push(capsys, broker, bundles["v2"], "device:dev1"))["state"] == "SUCCEEDED"
    serving(watcher, "dev1", "1.1.0")
    status, out = cli(capsys, "fleet", "release", "--target", "device:dev1", "--broker", broker.url)
    assert status == 0 and "released dev1" in out, out
    serving(watcher, "dev1", "1.0.0")  # the group's version, lower: the release is the operator's intent


def test_an_empty_retained_desired_hands_a_lab_device_back_to_its_group(
    capsys, broker: Broker, watcher: Watcher, agents, bundles
) -> None:
    agents("dev1", group="lobby", allow_unsigned_control=True, operator_keys=[])  # a lab device
    online(watcher, "dev1")
    assert finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "group:lobby"))["state"] == "SUCCEEDED"
    assert finished(watcher, "dev1", push(capsys, broker, bundles["v2"], "device:dev1"))["state"] == "SUCCEEDED"
    serving(watcher, "dev1", "1.1.0")
    publish_raw(broker, [("edge/dev1/desired", b"")])  # clears the retained device document
    serving(watcher, "dev1", "1.0.0")


def test_deployment_problem_while_an_index_is_awaited_then_cleared(
    broker: Broker, watcher: Watcher, agents, bundles, operator_key: Path
) -> None:
    agents("dev1", deployments={"stall_timeout_s": 1})
    online(watcher, "dev1")
    data = bundles["v1"].read_bytes()
    index = ChunkIndex.of(data, 256 * 1024)
    desired = sign(
        Desired(
            id="late-index",
            name="demo",
            version="1.0.0",
            sha256=index.sha256,
            size=index.size,
            chunk_size=index.chunk_size,
            chunks=len(index.chunks),
        ),
        load_private_key(operator_key),
        "device:dev1",
    )
    publish_raw(broker, [("edge/dev1/desired", desired.to_bytes())])
    waiting = watcher.wait_json("edge/dev1/status", lambda d: "no chunk index" in (d.get("deployment_problem") or ""))
    assert "still waiting" in waiting["deployment_problem"]
    chunks = [
        (Topics().chunk(index.sha256, i), data[i * index.chunk_size : (i + 1) * index.chunk_size])
        for i in range(len(index.chunks))
    ]
    publish_raw(broker, [*chunks, (Topics().index(index.sha256), index.to_bytes())])
    assert finished(watcher, "dev1", "late-index")["state"] == "SUCCEEDED"
    status = serving(watcher, "dev1", "1.0.0")
    assert status["deployment_problem"] is None


def test_a_document_of_a_newer_protocol_is_refused_with_the_reason_and_a_current_one_still_deploys(
    capsys, broker: Broker, watcher: Watcher, agents, bundles, operator_key: Path
) -> None:
    """docs/fleet.md#protocol-versions: an agent process given a desired document and a command
    of protocol 2 (each with a member protocol 1 does not know, signed by the operator) refuses
    both, naming the protocols (the status' ``deployment_problem``, the answer's code), and
    follows the next protocol 1 document; its status says which protocol and version it runs."""
    agents("dev1")
    status = online(watcher, "dev1")
    assert (status["protocol"], status["agent_version"]) == (PROTOCOL, AGENT_VERSION)
    key = load_private_key(operator_key)
    fields = {"id": "newer", "name": "demo", "version": "1.0.0", "sha256": "ab" * 32, "size": 1, "chunk_size": 1}
    newer = newer_protocol(key, "Desired", PROTOCOL + 1, **fields, chunks=1, target="device:dev1",
                           issued_at=round(time.time(), 3), canary_percent=5)  # fmt: skip
    publish_raw(broker, [("edge/dev1/desired", newer)])
    refused = watcher.wait_json("edge/dev1/status", lambda d: "PROTOCOL_TOO_NEW" in (d.get("deployment_problem") or ""))
    assert refused["deployment_problem"] == (
        f"PROTOCOL_TOO_NEW: edge/dev1/desired is a protocol {PROTOCOL + 1} document; this agent reads protocol "
        f"{PROTOCOL} and older: update edge-agent on this device"
    )
    command = newer_protocol(key, "CommandRequest", PROTOCOL + 1, id="newer-ping", command="ping", args={},
                             target="device:dev1", issued_at=round(time.time(), 3), deadline_s=5)  # fmt: skip
    answered = json.loads(request(broker, "dev1", "ping", command)[0])
    assert (answered["ok"], answered["error"]["code"]) == (False, "PROTOCOL_TOO_NEW"), answered
    assert finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))["state"] == "SUCCEEDED"
    assert serving(watcher, "dev1", "1.0.0")["deployment_problem"] is None


def test_the_status_error_names_why_the_current_version_cannot_serve(
    capsys, broker: Broker, watcher: Watcher, agents, bundles
) -> None:
    agent = agents("dev1")
    online(watcher, "dev1")
    finished(watcher, "dev1", push(capsys, broker, bundles["v1"], "device:dev1"))
    serving(watcher, "dev1", "1.0.0")
    agent.stop()
    state = Path(agent.config).parent / "state"
    model = next((state / "current").resolve().glob("*.onnx"))
    model.write_bytes(b"not a model any more")  # the disk rotted under the installed version
    agent.start()
    status = watcher.wait_json("edge/dev1/status", lambda d: d["state"] == "online" and d.get("error"))
    assert "NO_RUNTIME" in status["error"] and "cannot load" in status["error"]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_download_stops_cleanly_and_the_download_resumes(
    stop: signal.Signals, capsys, broker: Broker, watcher: Watcher, agents, bundles
) -> None:
    agent = agents("dev1", deployments={"max_download_rate": 250_000, "window": 4})
    online(watcher, "dev1")
    deployment = push(capsys, broker, bundles["v1"], "device:dev1", "--chunk-size", "16k")
    watcher.wait_json("edge/dev1/deployment", lambda d: d.get("progress", {}).get("chunks_done", 0) >= 10, 60)
    assert agent.process is not None
    agent.process.send_signal(stop)
    assert agent.process.wait(30) == 0, "a clean stop"
    # the agent published "offline" before it exited; the watcher, another client, gets it after
    watcher.wait_json("edge/dev1/status", lambda d: d.get("state") == "offline", 30)
    assert watcher.json("edge/dev1/deployment")["state"] == "DOWNLOADING", "the download is kept, not ended"
    agent.start()
    record = finished(watcher, "dev1", deployment)
    assert record["state"] == "SUCCEEDED" and record["progress"]["resumed"] >= 10, record["progress"]


def test_fleet_options_as_documented(capsys, broker: Broker, watcher: Watcher, agents, monkeypatch) -> None:
    """--listen bounds how long retained state is collected; rollback --timeout how long an answer
    is awaited; --password-env reads the broker password from the environment."""
    agents("dev1")
    online(watcher, "dev1")
    status, out = cli(capsys, "fleet", "status", "--broker", broker.url, "--json", "--listen", "0")
    assert json.loads(out) == {}, "nothing collected in no time"
    status, out = cli(capsys, "fleet", "status", "--broker", broker.url, "--json", "--listen", "5")
    assert "dev1" in json.loads(out)
    status, out = cli(capsys, "fleet", "rollback", "--target", "device:ghost", "--timeout", "1", "--broker", broker.url)
    assert status == 1 and "ghost: no answer within 1 s" in out, out
    with_password = ("fleet", "status", "--broker", broker.url, "--username", "u")
    with_password += ("--password-env", "EDGE_AGENT_TEST_PASSWORD")
    monkeypatch.setenv("EDGE_AGENT_TEST_PASSWORD", "not used by an anonymous broker")
    status, out = cli(capsys, *with_password)
    assert status == 0 and "dev1" in out
    monkeypatch.delenv("EDGE_AGENT_TEST_PASSWORD")
    status, out = cli(capsys, *with_password)
    assert status == 1 and "EDGE_AGENT_TEST_PASSWORD" in out, out


def test_a_rollback_that_cannot_start_in_time_is_busy(tmp_path: Path, keys) -> None:
    """BUSY: the deployer's thread is in a step that cannot be interrupted (here: not running)."""
    from agent.config.models import AgentConfig
    from agent.daemon.agent import Agent
    from agent.daemon.command_service import run_command
    from agent.hardware.board import probe

    config = AgentConfig.model_validate(
        {
            "state_dir": str(tmp_path / "state"),
            "trust_keys": [str(keys["public"])],
            "operator_keys": [str(keys["operator_pub"])],
            "mqtt": {"broker": "mqtt://127.0.0.1:9"},
        }
    )
    agent = Agent(config, probe())
    from agent.daemon.documents import deployment_payload
    from agent.deployment.deployer import Deployer

    assert agent.link is not None
    agent.deployer = Deployer(
        config=config,
        device="d",
        store=agent.store,
        board=probe(),
        link=agent.link,
        topics=agent.topics,
        policy=agent.policy,
        gate=agent.gate,
        on_switched=lambda d: None,
        payload=deployment_payload,
    )
    agent.deployer.rollback_timeout_s = 0.2
    assert agent.commands is not None
    answer = json.loads(run_command(agent.commands.commands, agent.commands.actions, "rollback", b"{}").payload)
    assert answer["error"]["code"] == "BUSY" and "still running" in answer["error"]["message"], answer
