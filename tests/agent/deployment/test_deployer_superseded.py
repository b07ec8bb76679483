"""`agent.deployment.deployer.Deployer`: a deployment replaced before its bundle arrived ends with a
final state (``REJECTED``, ``SUPERSEDED``), live and across a restart (real agent processes on a
real mosquitto)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from testkit.agent_process import AgentProcess
from testkit.broker import Broker, Watcher
from testkit.fleet import FINAL, cli, finished, publish_raw, push, serving
from testkit.net import wait_until

from agent.bundles.store import Store
from agent.mqtt.protocol import ChunkIndex, Topics


def half_download(
    capsys: pytest.CaptureFixture[str],
    broker: Broker,
    watcher: Watcher,
    agents,
    bundle: Path,
    target: str = "device:dev1",
):
    """`bundle` pushed to `target` (dev1, or its group lobby) in 16 KiB chunks with the second
    half of them taken off the broker, so the device's download stops midway for as long as the
    test needs. Returns the agent and the deployment id, once the device has half the chunks."""
    deployment = push(capsys, broker, bundle, target, "--chunk-size", "16k")
    data, topics = bundle.read_bytes(), Topics()
    index = ChunkIndex.of(data, 16384)
    half = len(index.chunks) // 2
    publish_raw(broker, [(topics.chunk(index.sha256, i), b"") for i in range(half, len(index.chunks))])
    agent: AgentProcess = agents("dev1", group="lobby")
    halfway = watcher.wait_json(
        "edge/dev1/deployment", lambda d: d.get("progress", {}).get("chunks_done", 0) >= half, 60
    )
    assert halfway["state"] == "DOWNLOADING", "the progress is published with the record as it is now"
    return agent, deployment


def superseded(watcher: Watcher, deployment: str, by: str | None) -> None:
    """`deployment`'s record ended superseded by `by` (None: by nothing, a release) among every
    record published: the next deployment's record replaces it on the retained topic at once."""

    def ended() -> dict[str, Any] | None:
        records = watcher.all_json("edge/dev1/deployment")
        return next((r for r in records if r["id"] == deployment and r["state"] in FINAL), None)

    record = wait_until(ended, 90, f"a final record of {deployment}")
    assert (record["state"], record["error"]["code"]) == ("REJECTED", "SUPERSEDED"), record
    states = [step["state"] for step in record["history"]]
    assert states[0] == "QUEUED" and states[-2:] == ["DOWNLOADING", "REJECTED"], "ended from where it was"
    assert record["error"]["message"] == (
        f"superseded by deployment {by} (demo 1.1.0)"
        if by is not None
        else "superseded: no desired document names this device any more (a release, or a clear)"
    )


def test_a_deployment_replaced_during_its_download_ends_superseded(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path], operator_key: Path
) -> None:
    _, first = half_download(capsys, broker, watcher, agents, bundles["v1"])
    second = push(capsys, broker, bundles["v2"], "device:dev1")
    superseded(watcher, first, by=second)
    assert finished(watcher, "dev1", second)["state"] == "SUCCEEDED"
    serving(watcher, "dev1", "1.1.0")


def test_a_deployment_replaced_while_the_agent_was_stopped_ends_superseded_at_the_next_start(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path], operator_key: Path
) -> None:
    """The group's document is not kept on the device: after the restart only the newer one is
    on the broker, and the record left DOWNLOADING ends before it starts."""
    agent, first = half_download(capsys, broker, watcher, agents, bundles["v1"], "group:lobby")
    assert agent.stop() == 0  # the download is kept: its record stays DOWNLOADING on disk
    second = push(capsys, broker, bundles["v2"], "group:lobby")
    agent.start()
    superseded(watcher, first, by=second)
    assert finished(watcher, "dev1", second)["state"] == "SUCCEEDED"
    serving(watcher, "dev1", "1.1.0")


def test_a_deployment_whose_device_is_released_during_its_download_ends_superseded(
    capsys, broker: Broker, watcher: Watcher, agents, bundles: dict[str, Path], operator_key: Path
) -> None:
    """No document takes its place (its group has none): nothing else would end it."""
    agent, first = half_download(capsys, broker, watcher, agents, bundles["v1"])
    status, out = cli(capsys, "fleet", "release", "--target", "device:dev1", "--broker", broker.url)
    assert status == 0, out
    superseded(watcher, first, by=None)
    assert agent.alive()
    assert agent.stop() == 0  # the deployer's thread has ended: followed.json is as it left it
    followed = Store(agent.config.parent / "state").followed()
    assert followed.id != first, "a superseded deployment is not followed (a release's downgrade holds)"
