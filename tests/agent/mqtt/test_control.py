"""`agent.mqtt.control`: the gate refuses what the operator did not sign for this device now; replays,
unsigned control, moved signatures, targets."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from testkit.control import NOW, TOPICS, Clock, desired, gate, newer_protocol, request

from agent.bundles.signing import load_private_key, load_public_key
from agent.mqtt.control import ControlRefused, sign, verify
from agent.mqtt.protocol import CommandRequest, Desired, ProtocolError, ProtocolTooNew, Release


@pytest.fixture
def stranger(keys: dict[str, Path]) -> Ed25519PrivateKey:
    return load_private_key(keys["other"])


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
    check = gate(tmp_path, keys, Clock())
    assert not check.vouches_for(made, "rollback"), "admission charges it to the junk's rate limit"
    with pytest.raises(ControlRefused, match=words) as refused:
        check.accept_command(made, "rollback")
    assert refused.value.code == "UNAUTHORIZED"


def test_a_command_runs_once_even_across_restarts(tmp_path: Path, keys, operator) -> None:
    signed = request(operator, id="once")
    check = gate(tmp_path, keys, Clock())
    assert check.vouches_for(signed, "rollback") and check.vouches_for(signed, "rollback"), "asking records nothing"
    assert check.accept_command(signed, "rollback") == signed
    assert not check.vouches_for(signed, "rollback"), "a replay is not vouched for"
    with pytest.raises(ControlRefused, match="run before"):
        gate(tmp_path, keys, Clock(NOW + 5)).accept_command(signed, "rollback")  # a new process, same state dir
    fresh = request(operator, id="twice", at=NOW + 700)
    later = gate(tmp_path, keys, Clock(NOW + 700))
    assert later.accept_command(fresh, "rollback") == fresh
    assert "once" not in json.loads((tmp_path / "control.json").read_text())["seen"], "expired ids are forgotten"


def test_unsigned_control_only_where_the_config_allows_it(tmp_path: Path, keys, stranger) -> None:
    lab = gate(tmp_path, keys, Clock(), allow_unsigned=True)
    assert lab.vouches_for(request(None), "rollback") and not lab.vouches_for(request(stranger), "rollback")
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


def test_a_group_document_is_accepted_only_by_its_own_group(tmp_path: Path, keys, operator) -> None:
    """A document the operator signed for group:yard, read by a device of group lobby (a hostile
    client copied it onto lobby's topic): refused, signed or (where allowed) unsigned."""
    yard = sign(desired(), operator, "group:yard", now=NOW)
    with pytest.raises(ControlRefused, match="for group:yard, not group:lobby"):
        gate(tmp_path, keys, Clock()).accept_document(yard, "group", newest_accepted=None)
    unsigned = desired().model_copy(update={"target": "group:yard"})
    with pytest.raises(ControlRefused, match="for group:yard, not group:lobby"):
        gate(tmp_path, keys, Clock(), allow_unsigned=True).accept_document(unsigned, "group", newest_accepted=None)
    lobby = sign(desired(), operator, "group:lobby", now=NOW)
    assert gate(tmp_path, keys, Clock()).accept_document(lobby, "group", newest_accepted=None) == lobby


def test_a_signature_cannot_move_to_another_kind_of_document(operator, keys) -> None:
    command = request(operator, id="same")
    as_release = Release.model_validate(
        {"id": "same", "release": True, "target": command.target, "issued_at": command.issued_at}
    ).model_copy(update={"signature": command.signature})
    with pytest.raises(ControlRefused, match="does not match"):
        verify(as_release, [load_public_key(keys["operator_pub"])])


@pytest.mark.parametrize(
    "target", ["cam-1", "device:", "group:", "host:cam-1", "device:a/b", "group:a+", "group:#", ""]
)
def test_a_target_that_is_not_device_or_group_is_refused_by_name(target: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(f"target {target!r} is not device:ID or group:NAME")):
        TOPICS.target_desired(target)


def test_protocol_is_inside_what_is_signed_and_old_signed_documents_still_verify(operator, keys) -> None:
    """A document signed before `protocol` existed (no such member) verifies as it did; one
    that states it is signed over it, so changing it after signing breaks the signature."""
    trusted = [load_public_key(keys["operator_pub"])]
    old = sign(desired(), operator, "device:cam-1", now=NOW)
    sent = json.loads(old.to_bytes())
    assert "protocol" not in sent and verify(Desired.parse(json.dumps(sent).encode(), "t"), trusted)
    stating = sign(desired(protocol=1), operator, "device:cam-1", now=NOW)
    assert json.loads(stating.to_bytes())["protocol"] == 1 and verify(stating, trusted)
    for changed in ({"protocol": None}, {"protocol": 2}):
        with pytest.raises(ControlRefused, match="does not match"):
            verify(stating.model_copy(update=changed), trusted)
    newer = json.loads(newer_protocol(operator, "CommandRequest", id="c", command="ping", target="device:cam-1"))
    with pytest.raises(ProtocolTooNew):  # refused before its signature is even looked at
        CommandRequest.parse(json.dumps(newer).encode(), "t")
