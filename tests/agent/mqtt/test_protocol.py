"""`agent.mqtt.protocol`: documents bounded and checked, the topic names docs/mqtt.md lists, the reply space."""

from __future__ import annotations

import json
import math

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from testkit.control import NOW, SHA, TOPICS, unchecked_rollout
from testkit.transfer import DATA

from agent.mqtt.protocol import (
    MAX_CONTROL_BYTES,
    PROTOCOL,
    ChunkIndex,
    CommandRequest,
    Desired,
    ProtocolError,
    ProtocolTooNew,
    Release,
    Topics,
)
from agent.mqtt.rollout_schedule import Halt


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


def test_the_reply_space() -> None:
    topics = Topics()
    assert topics.is_reply_topic("edge/replies/abc")
    for topic in ("edge/cam-2/desired", "edge/replies/", "edge/replies/a/b", "edge/replies/+", "other/replies/x"):
        assert not topics.is_reply_topic(topic), topic


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        (TOPICS.status("cam-1"), "fleet/a/cam-1/status"),
        (TOPICS.telemetry("cam-1"), "fleet/a/cam-1/telemetry"),
        (TOPICS.events("cam-1"), "fleet/a/cam-1/events"),
        (TOPICS.deployment("cam-1"), "fleet/a/cam-1/deployment"),
        (TOPICS.deployments("cam-1"), "fleet/a/cam-1/deployments"),
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


def test_chunk_index_and_desired_documents_are_checked() -> None:
    index = ChunkIndex.of(DATA, 16384)
    assert len(index.chunks) == 7 and index.span(6) == (6 * 16384, 100_000 - 6 * 16384)
    assert ChunkIndex.parse(index.to_bytes(), "t") == index
    with pytest.raises(ProtocolError, match="make 7 chunks, not 6"):
        ChunkIndex.parse(index.model_copy(update={"chunks": index.chunks[:6]}).to_bytes(), "t")
    good = {"id": "d1", "name": "demo", "version": "1.0.0", "sha256": index.sha256, "size": 1, "chunk_size": 1}
    with pytest.raises(ProtocolError, match="chunks"):
        Desired.parse(json.dumps(good).encode(), "edge/x/desired")
    for bad, words in [
        ({"chunks": 1, "source": "url"}, "url source needs url"),
        ({"chunks": 1, "source": "url", "url": "ftp://x"}, "is not http"),
        ({"chunks": 1, "sha256": "nothex"}, "sha256"),
        ({"chunks": 1, "extra": 1}, "extra"),
    ]:
        with pytest.raises(ProtocolError, match=words):
            Desired.parse(json.dumps({**good, **bad}).encode(), "edge/x/desired")


@pytest.mark.parametrize(
    ("rollout", "issued_at", "where"),
    [
        ({"start": math.inf}, NOW, "rollout.start"),
        ({"halted": Halt.model_construct(at=math.inf, reason="x")}, NOW, "rollout.halted.at"),
        ({}, math.inf, "issued_at"),  # newer than any document to come: the topic would be locked
    ],
)
def test_a_signed_document_with_a_number_that_is_not_finite_is_refused(
    operator: Ed25519PrivateKey, rollout: dict[str, object], issued_at: float, where: str
) -> None:
    """``start: Infinity`` once passed ``ge=0``: `/api/status` answered 500 and `fleet status`
    crashed on the rollout's wave time."""
    payload = unchecked_rollout(operator, issued_at=issued_at, **rollout)
    assert b"Infinity" in payload
    with pytest.raises(ProtocolError, match=rf"{where}: Input should be a finite number"):
        Desired.parse(payload, "edge/groups/lobby/desired")
    start = f'"start": {NOW}'.encode()
    if start in payload:  # a number too large for a float is Infinity too
        with pytest.raises(ProtocolError, match=r"rollout\.start: Input should be a finite number"):
            Desired.parse(payload.replace(start, b'"start": 1e999'), "edge/groups/lobby/desired")


DOCUMENT = {"id": "d", "name": "demo", "version": "1.0.0", "sha256": SHA, "size": 1, "chunk_size": 1, "chunks": 1}


@pytest.mark.parametrize(
    ("model", "members"),
    [
        (Desired, DOCUMENT),
        (Release, {"id": "r", "release": True}),
        (CommandRequest, {"id": "c", "command": "ping"}),
    ],
)
def test_a_document_of_a_newer_protocol_is_refused_as_such_not_misread(
    model: type[Desired] | type[Release] | type[CommandRequest], members: dict[str, object]
) -> None:
    """A protocol 2 document, with a key protocol 1 does not know, is refused as too new (its
    code and the protocols named), not as a document with an unknown key; the same without the
    new key is refused too: its meaning may have changed. Absent and 1 read as before."""
    newer = {**members, "protocol": PROTOCOL + 1, "deadline_s": 30}
    for payload in (newer, {**members, "protocol": PROTOCOL + 1}):
        with pytest.raises(ProtocolTooNew) as refused:
            model.parse(json.dumps(payload).encode(), "edge/cam-1/desired")
        assert str(refused.value).startswith(f"PROTOCOL_TOO_NEW: edge/cam-1/desired is a protocol {PROTOCOL + 1} ")
        assert f"reads protocol {PROTOCOL} and older" in str(refused.value) and refused.value.code == "PROTOCOL_TOO_NEW"
    assert model.parse(json.dumps(members).encode(), "t").protocol is None, "absent: protocol 1"
    assert model.parse(json.dumps({**members, "protocol": 1}).encode(), "t").protocol == 1
    for junk in (0, -1, 10**9, "2", 1.5):
        with pytest.raises(ProtocolError, match="protocol") as refused:
            model.parse(json.dumps({**members, "protocol": junk}).encode(), "t")
        assert not isinstance(refused.value, ProtocolTooNew), junk
