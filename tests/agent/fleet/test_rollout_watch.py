"""`agent.fleet.rollout_watch`: the tally decides failure from typed records (`State`, `ErrorCode`),
and a record that cannot be read is named, counted as not started, and never crashes the watch."""

from __future__ import annotations

import time

import pytest
from testkit.broker import Broker
from testkit.control import desired
from testkit.fleet import publish_raw
from testkit.rollouts import schedule
from testkit.snapshots import snapshot

from agent.bundles.record import Deployment, State
from agent.config.models import MqttSection
from agent.daemon.documents import deployment_document, deployment_payload, status_payload
from agent.errors import ErrorCode, ErrorInfo
from agent.fleet.client import connect
from agent.fleet.rollout_watch import is_failure, tally, watch
from agent.mqtt.device_documents import DeploymentDocument
from agent.mqtt.protocol import Topics
from agent.mqtt.rollout_schedule import FailureLimit

SHA = "b" * 64


def _record(state: State, code: ErrorCode | None = None, deployment_id: str = "d1") -> Deployment:
    error = ErrorInfo(code, "why") if code is not None else None
    return Deployment(id=deployment_id, sha256=SHA, state=state, name="demo", version="2.0.0", error=error)


def record(state: State, code: ErrorCode | None = None) -> DeploymentDocument:
    return deployment_document(_record(state, code))


@pytest.mark.parametrize(
    ("state", "code", "failed"),
    [
        (State.SUCCEEDED, None, False),
        (State.REJECTED, ErrorCode.PARITY_FAILED, True),
        (State.FAILED, ErrorCode.DOWNLOAD_TIMEOUT, True),
        (State.ROLLED_BACK, ErrorCode.PROBATION_FAILED, True),
        (State.ROLLED_BACK, ErrorCode.ROLLOUT_HALTED, False),
        (State.REJECTED, ErrorCode.CANCELLED, False),
        (State.REJECTED, ErrorCode.SUPERSEDED, False),  # a newer push replaced it: not the version's fault
        (State.REJECTED, None, True),
        (State.DOWNLOADING, None, False),
        (State.PROBATION, None, False),
    ],
)
def test_a_failure_is_a_final_state_without_the_version_for_its_own_reason(
    state: State, code: ErrorCode | None, failed: bool
) -> None:
    assert is_failure(record(state, code)) is failed


def test_the_tally_counts_typed_records_and_names_the_unreadable() -> None:
    document = desired(rollout=schedule(waves=[100], start=0.0, max_failures=FailureLimit(devices=1)))
    records = {
        "a": record(State.SUCCEEDED),
        "b": record(State.REJECTED, ErrorCode.PARITY_FAILED),
        "c": record(State.ROLLED_BACK, ErrorCode.ROLLOUT_HALTED),
        "d": record(State.REJECTED, ErrorCode.CANCELLED),
        "e": record(State.FAILED, ErrorCode.DOWNLOAD_TIMEOUT),
        "f": record(State.DOWNLOADING),
    }
    members = [*records, "g", "h"]
    current = tally(document, "lobby", members, records, 10.0, unreadable=["h", "stranger"])
    (wave,) = current.waves
    assert (wave.devices, wave.started, wave.succeeded, wave.failed, wave.running) == (8, 6, 1, 2, 1)
    assert current.failed_devices == ("b", "e") and current.exceeded, "2 failed, the limit is 1"
    assert current.unreadable == ("h",), "a stranger's junk is not the group's"
    assert not current.complete and "1 unreadable" in current.summary()


def test_an_unreadable_member_keeps_the_rollout_from_completing() -> None:
    document = desired(rollout=schedule(waves=[100], start=0.0))
    done = {"a": record(State.SUCCEEDED), "b": record(State.SUCCEEDED)}
    assert tally(document, "lobby", ["a", "b"], done, 10.0).complete
    with_junk = tally(document, "lobby", ["a", "b", "c"], done, 10.0, unreadable=["c"])
    assert not with_junk.complete and with_junk.unreadable == ("c",) and not with_junk.exceeded


def test_the_watch_names_junk_records_and_completes_once_they_are_records(broker: Broker) -> None:
    topics = Topics()
    document = desired(rollout=schedule(waves=[100], start=time.time() - 60, max_failures=FailureLimit(devices=0)))
    publish_raw(
        broker,
        [
            (topics.group_desired("lobby"), document.to_bytes()),
            *[(topics.status(d), status_payload(snapshot(device=d, group="lobby"))) for d in ("dev1", "dev2", "dev3")],
            (topics.deployment("dev1"), b'{"progress":"half"}'),
            (topics.deployment("dev2"), b'{"error":"boom"}'),
            (topics.deployment("dev3"), deployment_payload(_record(State.SUCCEEDED))),
        ],
    )
    link = connect(MqttSection(broker=broker.url))
    try:
        stuck = watch(link, topics, "d1", None, timeout=1.0, listen=1.0)
        assert stuck.unreadable == ("dev1", "dev2") and stuck.rollout.halted is None, "junk is no failure"
        assert (stuck.members, stuck.started, stuck.succeeded, stuck.failed) == (3, 1, 1, 0) and not stuck.complete
        good = [(topics.deployment(d), deployment_payload(_record(State.SUCCEEDED))) for d in ("dev1", "dev2")]
        publish_raw(broker, good)
        done = watch(link, topics, "d1", None, timeout=30.0, listen=1.0)
        assert done.complete and done.unreadable == () and done.succeeded == 3
    finally:
        link.stop()
