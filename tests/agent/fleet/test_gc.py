"""`agent.fleet.gc` over a real mosquitto: a desired document of a newer protocol than this
edge-agent reads may name any bundle, so gc removes nothing and says why; one of protocol 1
keeps its bundle as before."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit.broker import Broker, Watcher
from testkit.control import NOW, newer_protocol
from testkit.fleet import cli, publish_raw

from agent.bundles.signing import load_private_key
from agent.mqtt.protocol import PROTOCOL, ChunkIndex, Topics


def test_a_newer_protocol_document_stops_gc_with_nothing_removed(
    capsys: pytest.CaptureFixture[str], broker: Broker, watcher: Watcher, keys: dict[str, Path]
) -> None:
    data = b"a bundle's bytes" * 100
    index = ChunkIndex.of(data, 1024)
    topics = Topics()
    chunks = [(topics.chunk(index.sha256, i), data[i * 1024 : (i + 1) * 1024]) for i in range(len(index.chunks))]
    fields = {"id": "newer", "name": "demo", "version": "1.0.0", "sha256": index.sha256, "size": index.size}
    newer = newer_protocol(load_private_key(keys["operator"]), "Desired", PROTOCOL + 1, **fields, chunk_size=1024,
                           chunks=len(index.chunks), target="group:lobby", issued_at=NOW, canary_percent=5)  # fmt: skip
    publish_raw(broker, [*chunks, (topics.index(index.sha256), index.to_bytes()), ("edge/groups/lobby/desired", newer)])
    status, out = cli(capsys, "fleet", "gc", "--min-age", "0", "--broker", broker.url)
    assert status == 1, out
    assert (
        f"edge/groups/lobby/desired is a protocol {PROTOCOL + 1} document, newer than this edge-agent reads "
        f"({PROTOCOL}), and may name a bundle: nothing was removed" in out
    )
    watcher.sync("edge/sync")
    assert watcher.latest[topics.index(index.sha256)] == index.to_bytes(), "the index is still there"
    assert all(watcher.latest[topic] == chunk for topic, chunk in chunks), "every chunk is still there"
