"""`agent.deployment.desired`: the device's and its group's desired documents through the real
`ControlGate` with documents the operator signed: which one is followed, releases, replays
refused against followed.json and against what was accepted since, and what nothing changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from testkit.control import NOW, SHA, TOPICS, Clock, desired, gate, newer_protocol

from agent.bundles.store import Followed
from agent.deployment.desired import DesiredDocuments, latest
from agent.mqtt.control import ControlRefused, sign
from agent.mqtt.link import Message
from agent.mqtt.protocol import PROTOCOL, ProtocolError, ProtocolTooNew, Release

DEVICE_TOPIC, GROUP_TOPIC = TOPICS.desired("cam-1"), TOPICS.group_desired("lobby")


def _documents(
    tmp_path: Path, keys, followed: Followed | None = None, allow_unsigned: bool = False
) -> DesiredDocuments:
    record = followed or Followed()
    return DesiredDocuments("cam-1", TOPICS, gate(tmp_path, keys, Clock(), allow_unsigned), lambda: record)


def _signed(key: Ed25519PrivateKey, topic: str, at: float, **fields: object) -> Message:
    target = "device:cam-1" if topic == DEVICE_TOPIC else "group:lobby"
    return Message(topic, sign(desired(**fields), key, target, now=at).to_bytes(), retain=True)


def _release(key: Ed25519PrivateKey, at: float) -> Message:
    return Message(DEVICE_TOPIC, sign(Release(id="r1", release=True), key, "device:cam-1", now=at).to_bytes())


def _pinned_id(followed: Followed) -> str | None:
    """The id inside the device document `followed` keeps (it is kept as it arrived, signed or not)."""
    if followed.device_document is None:
        return None
    document = json.loads(followed.device_document)
    return str(document.get("payload", document).get("id"))


def test_latest_of_issue_times() -> None:
    assert latest(None, None) is None and latest() is None
    assert latest(None, 5.0, 3.0) == 5.0 and latest(2.0, None) == 2.0


def test_the_device_s_document_overrides_the_group_s_until_a_release(tmp_path: Path, keys, operator) -> None:
    docs = _documents(tmp_path, keys)
    docs.accept(_signed(operator, GROUP_TOPIC, NOW - 60, id="group-1", version="1.0.0"))
    with docs.lock:
        assert docs.wanted() is docs.group_doc and docs.group_doc.id == "group-1"  # type: ignore[union-attr]
        assert docs.kind_of(docs.group_doc) == "group"  # type: ignore[arg-type]
    docs.accept(_signed(operator, DEVICE_TOPIC, NOW - 30, id="lab-2", version="2.0.0"))
    with docs.lock:
        wanted = docs.wanted()
        assert wanted is not None and wanted.id == "lab-2" and docs.kind_of(wanted) == "device"
    assert not docs.back_to_group and not docs.release_pending

    docs.accept(_release(operator, NOW - 10))
    with docs.lock:
        assert docs.device_doc is None and docs.wanted() is docs.group_doc
    assert docs.back_to_group and docs.release_pending
    assert docs.take_release() == NOW - 10
    assert docs.take_release() is None, "a release is recorded once"
    assert not docs.release_pending


def test_a_document_older_than_followed_json_or_than_one_accepted_since_is_refused(
    tmp_path: Path, keys, operator
) -> None:
    docs = _documents(tmp_path, keys, Followed("d0", device_issued=NOW - 100, group_issued=NOW - 50))
    with pytest.raises(ControlRefused, match="issued before"):
        docs.accept(_signed(operator, DEVICE_TOPIC, NOW - 101, id="replayed"))
    with pytest.raises(ControlRefused, match="issued before"):
        docs.accept(_signed(operator, GROUP_TOPIC, NOW - 51, id="replayed"))
    docs.accept(_signed(operator, GROUP_TOPIC, NOW - 49, id="newer"))  # each topic against its own time
    docs.accept(_signed(operator, DEVICE_TOPIC, NOW - 20, id="d2"))
    with pytest.raises(ControlRefused, match="issued before"):
        docs.accept(_signed(operator, DEVICE_TOPIC, NOW - 40, id="d1"))  # after followed.json, before d2
    with docs.lock:
        assert docs.device_doc is not None and docs.device_doc.id == "d2", "a refusal changes nothing"
    newest = docs.newest(Followed("d2", NOW - 100, NOW - 50))
    assert (newest.id, newest.device_issued, newest.group_issued) == ("d2", NOW - 20, NOW - 49)
    assert _pinned_id(newest) == "d2", "the device's own document in force is kept for a restart"
    newest = docs.newest(Followed("d3", NOW - 5, None))
    assert (newest.id, newest.device_issued, newest.group_issued) == ("d3", NOW - 5, NOW - 49), "never backwards"


def test_unsigned_and_misplaced_documents(tmp_path: Path, keys, operator) -> None:
    strict = _documents(tmp_path, keys)
    with pytest.raises(ControlRefused, match="an empty message is unsigned"):
        strict.accept(Message(DEVICE_TOPIC, b""))
    with pytest.raises(ControlRefused, match="not signed"):
        strict.accept(Message(DEVICE_TOPIC, desired().to_bytes()))
    release_on_group = Message(
        GROUP_TOPIC, sign(Release(id="r", release=True), operator, "group:lobby", NOW).to_bytes()
    )
    with pytest.raises(ProtocolError, match="a release belongs on a device's desired topic"):
        strict.accept(release_on_group)
    assert not strict.back_to_group

    lab = _documents(tmp_path / "lab", keys, allow_unsigned=True)
    lab.accept(Message(DEVICE_TOPIC, desired(id="lab").to_bytes()))
    with lab.lock:
        assert lab.device_doc is not None and lab.device_doc.id == "lab"
    newest = lab.newest(Followed())
    assert (newest.device_issued, newest.group_issued) == (None, None), "an unsigned document has no issue time"
    assert _pinned_id(newest) == "lab"
    lab.accept(Message(DEVICE_TOPIC, b""))  # a clear: back to the group, with no release to record
    with lab.lock:
        assert lab.device_doc is None
    assert lab.back_to_group and not lab.release_pending


def test_a_desired_document_or_release_of_a_newer_protocol_is_refused_and_changes_nothing(
    tmp_path: Path, keys, operator
) -> None:
    """The device keeps following what it followed: a newer operator's document (a member this
    agent does not know) or release is refused as too new, naming the topic and both protocols
    (the deployer shows it as the status' ``deployment_problem``), not read as protocol 1."""
    documents = _documents(tmp_path, keys)
    documents.accept(_signed(operator, DEVICE_TOPIC, NOW, id="followed"))
    fields = {"id": "newer", "name": "demo", "version": "2.0.0", "sha256": SHA, "size": 10, "chunk_size": 10}
    newer = newer_protocol(operator, "Desired", **fields, chunks=1, target="device:cam-1", issued_at=NOW + 1,
                           canary_percent=5)  # fmt: skip
    release = newer_protocol(operator, "Release", id="r2", release=True, target="device:cam-1", issued_at=NOW + 1)
    for payload in (newer, release):
        with pytest.raises(ProtocolTooNew) as refused:
            documents.accept(Message(DEVICE_TOPIC, payload, retain=True))
        assert str(refused.value).startswith(
            f"PROTOCOL_TOO_NEW: {DEVICE_TOPIC} is a protocol {PROTOCOL + 1} document; this agent reads protocol "
            f"{PROTOCOL} and older"
        )
    with documents.lock:
        assert documents.device_doc is not None and documents.device_doc.id == "followed"
    assert not documents.back_to_group and not documents.release_pending
