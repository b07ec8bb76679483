"""`fleet gc`: bundles whose chunks stay retained on the broker although no desired document
names them any more."""

from __future__ import annotations

from datetime import datetime, timezone

from agent.fleet.client import collect, publish_retained, wait_acked
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import ChunkIndex, Desired, ProtocolError, Topics


def unreferenced_bundles(
    link: MqttLink, topics: Topics, wait: float = 2.0, min_age_s: float = 600.0
) -> dict[str, ChunkIndex]:
    """Bundles whose chunks are on the broker but that no desired document names, pushed more
    than `min_age_s` seconds ago (a push in progress has its chunks out before its desired
    document: a younger index may belong to one)."""
    root = topics.root
    messages = collect(link, [f"{root}/bundles/+/index", f"{root}/+/desired", f"{root}/groups/+/desired"], wait)
    referenced, indexes = set(), {}
    for topic, payload in messages.items():
        try:
            if topic.endswith("/index"):
                index = ChunkIndex.parse(payload, topic)
                indexes[index.sha256] = index
            else:
                referenced.add(Desired.parse(payload, topic).sha256)
        except ProtocolError:
            continue  # not ours to judge; a device reports it
    now = datetime.now(timezone.utc)

    def old_enough(index: ChunkIndex) -> bool:
        created = index.created
        if created is None:
            return True
        if created.tzinfo is None:
            created = created.replace(tzinfo=timezone.utc)
        return (now - created).total_seconds() >= min_age_s

    return {sha: index for sha, index in indexes.items() if sha not in referenced and old_enough(index)}


def clear_bundle(link: MqttLink, topics: Topics, index: ChunkIndex, timeout: float = 60.0) -> None:
    """Remove a bundle's retained chunks and index from the broker."""
    infos = [publish_retained(link, topics.chunk(index.sha256, i), b"") for i in range(len(index.chunks))]
    infos.append(publish_retained(link, topics.index(index.sha256), b""))
    wait_acked(infos, link, timeout)
