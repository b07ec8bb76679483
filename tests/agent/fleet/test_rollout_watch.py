"""`agent.fleet.rollout_watch`: the tally decides failure from typed records (`State`, `ErrorCode`),
and a record that cannot be read is named, counted as not started, and never crashes the watch."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
from testkit.broker import Broker
from testkit.control import NOW, desired, newer_protocol
from testkit.fleet import cli, publish_raw
from testkit.quality_records import quality, shadow
from testkit.rollouts import schedule
from testkit.snapshots import snapshot

from agent.bundles.record import Deployment, State
from agent.bundles.signing import load_private_key
from agent.config.models import MqttSection
from agent.daemon.documents import deployment_document, deployment_payload, status_payload
from agent.errors import ErrorCode, ErrorInfo
from agent.fleet.client import FleetError, connect
from agent.fleet.rollout_watch import FleetList, find_rollout, is_failure, tally, watch
from agent.mqtt.device_documents import DeploymentDocument
from agent.mqtt.protocol import PROTOCOL, Topics
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
        (State.REJECTED, ErrorCode.SHADOW_DISAGREES, True),  # the shadow saw it blind before the switch
        (State.REJECTED, ErrorCode.SHADOW_UNAVAILABLE, True),  # asked for a shadow, the device could not run one
        (State.ROLLED_BACK, ErrorCode.PROBATION_BLIND, True),  # probation saw it blind after the switch
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


def test_quality_failures_halt_a_rollout_like_any_failure() -> None:
    """Two of four devices that started fail on quality (one before the switch, one after),
    past a limit of one: the tally is exceeded, names both, and says what each judged."""
    document = desired(rollout=schedule(waves=[100], start=0.0, max_failures=FailureLimit(devices=1)))
    disagrees = replace(_record(State.REJECTED, ErrorCode.SHADOW_DISAGREES), shadow=shadow("disagrees"))
    blind = replace(_record(State.ROLLED_BACK, ErrorCode.PROBATION_BLIND), shadow=shadow(), quality=quality("blind"))
    quiet = replace(_record(State.SUCCEEDED), shadow=shadow("quiet"))
    records = {
        "a": deployment_document(disagrees),
        "b": deployment_document(blind),
        "c": deployment_document(quiet),
        "d": record(State.SUCCEEDED),
    }
    current = tally(document, "lobby", records, records, 10.0)
    assert (current.started, current.failed, current.succeeded) == (4, 2, 2)
    assert current.failed_devices == ("a", "b") and current.exceeded and current.complete
    assert current.quality == (
        ("a", "shadow disagrees 0.31<0.8"),
        ("b", "shadow agrees 0.91; probation blind 0.05<0.5"),
        ("c", "shadow quiet"),
    ), "each judged device, as fleet status says it; d was not judged"
    one = tally(document, "lobby", records, {d: records[d] for d in "acd"}, 10.0)
    assert one.failed == 1 and not one.exceeded, "one quality failure is within the limit of one"


def test_a_failure_share_is_of_the_devices_that_started_not_of_the_group() -> None:
    """max_failures 20 %: 1 failure among the 3 devices that started (of 10) is past it (1 > 0.6);
    among 10 started it is not (1 > 2 is false)."""
    document = desired(rollout=schedule(waves=[100], start=0.0, max_failures=FailureLimit(percent=20)))
    members = [f"cam-{i}" for i in range(10)]
    early = {"cam-0": record(State.REJECTED, ErrorCode.PARITY_FAILED), "cam-1": record(State.SUCCEEDED)}
    early["cam-2"] = record(State.DOWNLOADING)
    current = tally(document, "lobby", members, early, 10.0)
    assert (current.members, current.started, current.failed) == (10, 3, 1) and current.exceeded
    everyone = {
        **{d: record(State.SUCCEEDED) for d in members},
        "cam-0": record(State.REJECTED, ErrorCode.PARITY_FAILED),
    }
    assert not tally(document, "lobby", members, everyone, 10.0).exceeded


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


def test_with_the_fleet_list_the_tally_counts_only_its_devices_of_the_group() -> None:
    document = desired(rollout=schedule(waves=[100], start=0.0, max_failures=FailureLimit(devices=0)))
    fleet = FleetList.parse(
        ["dev1:lobby", "dev2:lobby", "dev3  # no group: counts when it reports lobby", "yard1:yard"]
    )
    records = {"dev1": record(State.SUCCEEDED), "ghost": record(State.FAILED, ErrorCode.DOWNLOAD_TIMEOUT)}
    current = tally(document, "lobby", ["dev1", "dev3", "ghost", "yard1"], records, 10.0, fleet=fleet)
    assert current.ignored == ("ghost", "yard1") and current.failed == 0 and not current.exceeded
    assert (current.members, current.started, current.succeeded) == (3, 1, 1), "dev2 is a member though silent"
    assert "2 ignored (not the group's in the fleet list)" in current.summary() and not current.complete
    assert tally(document, "lobby", ["dev1", "ghost"], records, 10.0).exceeded, "without the list the ghost counts"


def test_a_forged_failure_of_a_device_not_in_the_fleet_list_does_not_halt_the_rollout(
    broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The red team's retained status and FAILED record for "ghost", a device that never
    existed, made `fleet rollout watch` sign a halt (with on_halt rollback, the healthy devices
    would have rolled back). With the fleet's list the ghost is ignored and named."""
    topics = Topics()
    rollout = schedule(waves=[100], start=time.time() - 60, max_failures=FailureLimit(devices=0), on_halt="rollback")
    ghost_failed = Deployment(
        id="d1", sha256=SHA, state=State.FAILED, error=ErrorInfo(ErrorCode.DOWNLOAD_TIMEOUT, "no chunk")
    )
    publish_raw(
        broker,
        [
            (topics.group_desired("lobby"), desired(rollout=rollout).to_bytes()),
            *[(topics.status(d), status_payload(snapshot(device=d, group="lobby"))) for d in ("dev1", "dev2", "ghost")],
            *[(topics.deployment(d), deployment_payload(_record(State.SUCCEEDED))) for d in ("dev1", "dev2")],
            (topics.deployment("ghost"), deployment_payload(ghost_failed)),
        ],
    )
    devices = tmp_path / "devices.txt"
    devices.write_text("# the fleet\ndev1:lobby\ndev2:lobby\n")
    watch_args = ("fleet", "rollout", "watch", "d1", "--broker", broker.url, "--listen", "1", "--timeout", "5")
    status, out = cli(capsys, *watch_args, "--devices-file", str(devices))
    assert status == 0, out
    assert "complete" in out and "ignored, not the group's in the fleet list (forged, or list them): ghost" in out, out
    link = connect(MqttSection(broker=broker.url))
    try:
        group, document = find_rollout(link, topics, "d1")
        assert group == "lobby" and document.rollout is not None and document.rollout.halted is None, "no halt signed"
        status, out = cli(
            capsys, "fleet", "rollout", "status", "d1", "--broker", broker.url, "--devices-file", str(devices)
        )
        assert status == 0 and "2/2 started, 2 succeeded, 0 failed, 1 ignored" in out, out
        # the same reports without the list: the ghost's failure counts, and the watch halts
        status, out = cli(capsys, *watch_args)
        assert status == 1 and "no --devices-file" in out and "failed: ghost" in out, out
        assert find_rollout(link, topics, "d1")[1].rollout.halted is not None  # type: ignore[union-attr]
    finally:
        link.stop()


def test_a_rollout_in_a_document_of_a_newer_protocol_is_named_as_unread_not_as_missing(
    broker: Broker, keys: dict[str, Path]
) -> None:
    """``rollout status|watch|halt ID`` cannot read a newer operator's group document, which may
    be the rollout asked for: the error names it instead of saying no group has it."""
    topics = Topics()
    fields = {"id": "d9", "name": "demo", "version": "1.0.0", "sha256": SHA, "size": 1, "chunk_size": 1, "chunks": 1}
    newer = newer_protocol(load_private_key(keys["operator"]), "Desired", PROTOCOL + 1, **fields,
                           target="group:lobby", issued_at=NOW)  # fmt: skip
    publish_raw(broker, [(topics.group_desired("lobby"), newer)])
    link = connect(MqttSection(broker=broker.url))
    try:
        with pytest.raises(FleetError) as missing:
            find_rollout(link, topics, "d9")
    finally:
        link.stop()
    assert str(missing.value).endswith("; this edge-agent cannot read the newer protocol of edge/groups/lobby/desired")
