"""Signed control without a broker: the gate's decisions, command envelopes, rate limits, bounded
documents, the ACL text and the fleet's reading of junk on the broker."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent.bundles.signing import load_private_key, load_public_key
from agent.fleet.acl import mosquitto_acl, parse_devices
from agent.fleet.state import status_rows
from agent.mqtt.commands import Command, NoArgs, PipelineArgs, RateLimits, ThrottledLog, run_command
from agent.mqtt.control import ControlGate, ControlRefused, SeenIds, sign, verify
from agent.mqtt.protocol import MAX_CONTROL_BYTES, CommandRequest, Desired, ProtocolError, Release, Topics

NOW = 1_800_000_000.0
SHA = "ab" * 32


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def desired(**fields: object) -> Desired:
    base: dict[str, object] = {
        "id": "d1",
        "name": "demo",
        "version": "1.0.0",
        "sha256": SHA,
        "size": 10,
        "chunk_size": 10,
        "chunks": 1,
    }
    return Desired.model_validate({**base, **fields})


def gate(tmp_path: Path, keys: dict[str, Path], clock: Clock, allow_unsigned: bool = False) -> ControlGate:
    seen = SeenIds(tmp_path / "control.json", keep_s=600)
    operators = [load_public_key(keys["operator_pub"])]
    return ControlGate(operators, allow_unsigned, 300, "cam-1", "lobby", seen, clock)


@pytest.fixture
def operator(keys: dict[str, Path]) -> Ed25519PrivateKey:
    return load_private_key(keys["operator"])


@pytest.fixture
def stranger(keys: dict[str, Path]) -> Ed25519PrivateKey:
    return load_private_key(keys["other"])


def request(key: Ed25519PrivateKey | None, name: str = "rollback", target: str = "device:cam-1", **fields: object):
    document = CommandRequest(id=str(fields.pop("id", "r1")), command=name, args=dict(fields.pop("args", {})))  # type: ignore[call-overload]
    at = float(fields.pop("at", NOW))  # type: ignore[arg-type]
    return sign(document, key, target, now=at) if key is not None else document.model_copy(update={"target": target})


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("unsigned", "not signed"),
        ("stranger", "not an operator key"),
        ("tampered", "does not match"),
        ("other device", "for device:cam-2, not device:cam-1"),
        ("group target", "for group:lobby, not device:cam-1"),
        ("too old", "more than max_clock_skew_s"),
        ("future", "in the future"),
        ("wrong command", "'ping' request sent to the 'rollback' command"),
    ],
)
def test_the_gate_refuses_commands_the_operator_did_not_sign_for_this_device_now(
    tmp_path: Path, keys, operator, stranger, case: str, words: str
) -> None:
    made = {
        "unsigned": lambda: request(None),
        "stranger": lambda: request(stranger),
        "tampered": lambda: request(operator, args={}).model_copy(update={"args": {"pipeline": "x"}}),
        "other device": lambda: request(operator, target="device:cam-2"),
        "group target": lambda: request(operator, target="group:lobby"),
        "too old": lambda: request(operator, at=NOW - 301),
        "future": lambda: request(operator, at=NOW + 301),
        "wrong command": lambda: request(operator, name="ping"),
    }[case]()
    with pytest.raises(ControlRefused, match=words) as refused:
        gate(tmp_path, keys, Clock()).accept_command(made, "rollback")
    assert refused.value.code == "UNAUTHORIZED"


def test_a_command_runs_once_even_across_restarts(tmp_path: Path, keys, operator) -> None:
    signed = request(operator, id="once")
    assert gate(tmp_path, keys, Clock()).accept_command(signed, "rollback") == signed
    with pytest.raises(ControlRefused, match="run before"):
        gate(tmp_path, keys, Clock(NOW + 5)).accept_command(signed, "rollback")  # a new process, same state dir
    fresh = request(operator, id="twice", at=NOW + 700)
    later = gate(tmp_path, keys, Clock(NOW + 700))
    assert later.accept_command(fresh, "rollback") == fresh
    assert "once" not in json.loads((tmp_path / "control.json").read_text())["seen"], "expired ids are forgotten"


def test_unsigned_control_only_where_the_config_allows_it(tmp_path: Path, keys, stranger) -> None:
    lab = gate(tmp_path, keys, Clock(), allow_unsigned=True)
    assert lab.accept_command(request(None), "rollback").signature is None
    with pytest.raises(ControlRefused, match="not an operator key"):
        lab.accept_command(request(stranger), "rollback")  # a signature is still checked against the keys it has
    with pytest.raises(ControlRefused, match="for device:cam-2"):
        lab.accept_command(request(None, target="device:cam-2"), "rollback")


def test_desired_documents_are_judged_against_the_newest_accepted_not_the_clock(tmp_path: Path, keys, operator) -> None:
    check = gate(tmp_path, keys, Clock())
    week_old = sign(desired(), operator, "device:cam-1", now=NOW - 7 * 86400)
    assert check.accept_document(week_old, "device", newest_accepted=None) == week_old, "an offline device catches up"
    with pytest.raises(ControlRefused, match="issued before"):
        check.accept_document(week_old, "device", newest_accepted=NOW - 3600)
    group = sign(desired(), operator, "group:lobby", now=NOW)
    assert check.accept_document(group, "group", newest_accepted=NOW)
    with pytest.raises(ControlRefused, match="for group:lobby, not device:cam-1"):
        check.accept_document(group, "device", newest_accepted=None)
    release = sign(Release(id="r", release=True), operator, "device:cam-1", now=NOW)
    assert check.accept_document(release, "device", None) == release


def test_a_signature_cannot_move_to_another_kind_of_document(operator, keys) -> None:
    command = request(operator, id="same")
    as_release = Release.model_validate(
        {"id": "same", "release": True, "target": command.target, "issued_at": command.issued_at}
    ).model_copy(update={"signature": command.signature})
    with pytest.raises(ControlRefused, match="does not match"):
        verify(as_release, [load_public_key(keys["operator_pub"])])


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"name": "x" * 5_000_000}, "more than 16384"),
        ({"name": "n" * 200}, "name"),
        ({"url": "https://" + "a" * 3000, "source": "url"}, "at most 2048"),
        ({"version": "1" * 100}, "at most 64"),
        ({"target": "device:a/b"}, "target"),
    ],
)
def test_protocol_documents_are_bounded(fields: dict[str, object], words: str) -> None:
    document = {"id": "d", "name": "demo", "version": "1.0.0", "sha256": SHA, "size": 1, "chunk_size": 1, "chunks": 1}
    payload = json.dumps({**document, **fields}).encode()
    with pytest.raises(ProtocolError, match=words):
        Desired.parse(payload, "edge/cam-1/desired")
    assert MAX_CONTROL_BYTES == 16384


def test_command_answers_with_gate_and_echo_limits(tmp_path: Path, keys, operator) -> None:
    commands = {"rollback": Command(NoArgs, lambda a: {"done": True}), "restart-pipeline": Command(PipelineArgs, dict)}
    check = gate(tmp_path, keys, Clock())
    unsigned = json.loads(run_command(commands, "rollback", b"{}", check).payload)
    assert unsigned["error"]["code"] == "UNAUTHORIZED"
    signed = json.loads(run_command(commands, "rollback", request(operator).to_bytes(), check).payload)
    assert signed == {"ok": True, "command": "rollback", "result": {"done": True}}
    huge = request(operator, name="restart-pipeline", id="big", args={"pipeline": "p" * 10_000})
    answer = run_command(commands, "restart-pipeline", huge.to_bytes(), check)
    assert len(answer.payload) < 2000 and json.loads(answer.payload)["error"]["code"] == "BAD_PAYLOAD"
    unknown = json.loads(run_command(commands, "x" * 100_000, b"", check).payload)
    assert unknown["error"]["code"] == "UNKNOWN_COMMAND" and len(json.dumps(unknown)) < 1000


def test_rate_limits_keep_one_flooded_command_from_starving_the_others() -> None:
    clock = Clock(0.0)
    limits = RateLimits(("snapshot", "ping"), clock=clock)
    allowed = sum(limits.allow("snapshot") for _ in range(5000))
    assert allowed == 4, "a burst of 4 snapshots, then 2 a second"
    assert limits.allow("ping"), "ping has its own bucket"
    clock.now = 1.0
    assert sum(limits.allow("snapshot") for _ in range(10)) == 2
    assert sum(limits.allow(f"junk-{i}") for i in range(100)) == 10, "every unknown name shares one bucket"
    assert limits.dropped == 4996 + 8 + 90


def test_throttled_log_bounds_the_lines(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(0.0)
    throttled = ThrottledLog(logging.getLogger("test.throttle"), every_s=10, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        for _ in range(1000):
            throttled.warning("flood", "dropped")
        clock.now = 11
        throttled.warning("flood", "dropped")
    assert [r.getMessage() for r in caplog.records] == ["dropped", "dropped (999 more like it not logged)"]


def test_the_reply_space() -> None:
    topics = Topics()
    assert topics.is_reply_topic("edge/replies/abc")
    for topic in ("edge/cam-2/desired", "edge/replies/", "edge/replies/a/b", "edge/replies/+", "other/replies/x"):
        assert not topics.is_reply_topic(topic), topic


TOPICS = Topics("fleet/a")


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        (TOPICS.status("cam-1"), "fleet/a/cam-1/status"),
        (TOPICS.telemetry("cam-1"), "fleet/a/cam-1/telemetry"),
        (TOPICS.events("cam-1"), "fleet/a/cam-1/events"),
        (TOPICS.deployment("cam-1"), "fleet/a/cam-1/deployment"),
        (TOPICS.desired("cam-1"), "fleet/a/cam-1/desired"),
        (TOPICS.group_desired("lobby"), "fleet/a/groups/lobby/desired"),
        (TOPICS.command("cam-1", "ping"), "fleet/a/cam-1/cmd/ping"),
        (TOPICS.reply("t0k"), "fleet/a/replies/t0k"),
        (TOPICS.index(SHA), f"fleet/a/bundles/{SHA}/index"),
        (TOPICS.chunk(SHA, 7), f"fleet/a/bundles/{SHA}/7"),
        (TOPICS.target_desired("device:cam-1"), "fleet/a/cam-1/desired"),
        (TOPICS.target_desired("group:lobby"), "fleet/a/groups/lobby/desired"),
        (Topics().status("cam-1"), "edge/cam-1/status"),
    ],
)
def test_topic_names_as_docs_mqtt_lists_them(topic: str, expected: str) -> None:
    assert topic == expected


def test_a_device_topic_splits_back_into_device_and_leaf() -> None:
    assert TOPICS.split_device(TOPICS.command("cam-1", "ping")) == ("cam-1", "cmd/ping")


@pytest.mark.parametrize(
    "target", ["cam-1", "device:", "group:", "host:cam-1", "device:a/b", "group:a+", "group:#", ""]
)
def test_a_target_that_is_not_device_or_group_is_refused_by_name(target: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(f"target {target!r} is not device:ID or group:NAME")):
        TOPICS.target_desired(target)


def test_fleet_acl_lists_each_device_s_own_topics() -> None:
    devices = parse_devices(["cam-01:lobby", "# a comment", "", "cam-02  # no group"])
    assert devices == [("cam-01", "lobby"), ("cam-02", None)]
    text = mosquitto_acl(devices, ["ops"], Topics())
    block = text.split("# device cam-01")[1].split("# device")[0]
    assert "topic read edge/groups/lobby/desired" in block and "topic write edge/cam-01/status" in block
    assert "topic write edge/cam-01/report" in block, "the optimisation report (deployments.report)"
    assert "edge/cam-02" not in block and "topic readwrite edge/#" in text.split("# device")[0]
    with pytest.raises(ValueError, match="line 1"):
        parse_devices(["cam 1"])


def test_fleet_status_skips_junk_and_shows_the_last_bundle_after_a_will() -> None:
    rows = status_rows(
        {
            "dev1": {
                "status": {"state": "offline", "device": "dev1"},
                "deployment": {"state": "SUCCEEDED", "name": "demo", "version": "1.1.0"},
            }
        }
    )
    assert rows[0]["bundle"] == "demo 1.1.0" and rows[0]["state"] == "offline"


def test_size_and_free_disk_are_checked_before_a_byte_is_written(tmp_path: Path) -> None:
    import shutil

    from agent.daemon.download import check_size
    from agent.errors import BundleError

    with pytest.raises(BundleError, match=r"more than bundle_limits\.max_bundle_bytes") as too_large:
        check_size(desired(size=10**18, chunks=1, chunk_size=10**18), 1 << 30, tmp_path)
    assert too_large.value.code == "TOO_LARGE"
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(BundleError, match="MB free under") as full:
        check_size(desired(size=free // 2 + 1, chunks=1, chunk_size=free), 1 << 62, tmp_path)
    assert full.value.code == "DISK_FULL"
    check_size(desired(size=1000, chunks=1, chunk_size=1000), 1 << 30, tmp_path)  # fits
    assert list(tmp_path.iterdir()) == [], "nothing was written"
