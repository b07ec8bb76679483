"""`fleet gc`: bundles whose chunks stay retained on the broker although no desired document
names them any more, and stray chunk topics beyond their bundle's index.

It reads every retained topic under ``<root>/bundles/`` once (the chunks' bytes travel, but are
not kept)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from agent.fleet.client import FleetError, collect, publish_retained, wait_acked
from agent.mqtt.link import MqttLink
from agent.mqtt.protocol import PROTOCOL, ChunkIndex, Desired, ProtocolError, ProtocolTooNew, Topics


@dataclass(frozen=True)
class Findings:
    """What `unreferenced_bundles` found: bundles no desired document names (and old enough to
    remove), chunk topics beyond their bundle's index (`strays`), and chunk topics of bundles
    without an index (`orphans`: maybe a push in progress, so they are left alone)."""

    unreferenced: dict[str, ChunkIndex]
    strays: list[str]
    orphans: list[str]


def unreferenced_bundles(link: MqttLink, topics: Topics, wait: float = 2.0, min_age_s: float = 600.0) -> Findings:
    """Bundles whose chunks are on the broker but that no desired document names, pushed more
    than `min_age_s` seconds ago (a push in progress has its chunks out before its desired
    document: a younger index may belong to one), and stray chunk topics."""
    root = topics.root
    filters = [f"{root}/bundles/+/+", f"{root}/+/desired", f"{root}/groups/+/desired"]
    messages = collect(link, filters, wait, keep=lambda topic: not topic.rsplit("/", 1)[1].isdigit())
    referenced, indexes, chunks = set(), {}, []
    for topic, payload in messages.items():
        leaf = topic.rsplit("/", 1)[1]
        try:
            if leaf.isdigit():
                chunks.append(topic)
            elif leaf == "index":
                index = ChunkIndex.parse(payload, topic)
                indexes[index.sha256] = index
            elif leaf == "desired":
                referenced.add(Desired.parse(payload, topic).sha256)
        except ProtocolTooNew as exc:  # it may name any bundle: removing none is the only safe answer
            raise FleetError(
                f"{topic} is a protocol {exc.protocol} document, newer than this edge-agent reads ({PROTOCOL}), and "
                "may name a bundle: nothing was removed; run fleet gc with an edge-agent that reads it"
            ) from exc
        except ProtocolError:
            continue  # not ours to judge; a device reports it
    strays, orphans = [], []
    for topic in chunks:
        sha, number = topic.split("/")[-2:]
        index = indexes.get(sha)
        if index is None:
            orphans.append(topic)
        elif int(number) >= len(index.chunks):
            strays.append(topic)
    now = datetime.now(timezone.utc)

    def old_enough(index: ChunkIndex) -> bool:
        created = index.created
        if created is None:
            return True
        if created.tzinfo is None:
            created = created.replace(tzinfo=timezone.utc)
        return (now - created).total_seconds() >= min_age_s

    unreferenced = {sha: index for sha, index in indexes.items() if sha not in referenced and old_enough(index)}
    return Findings(unreferenced, sorted(strays), sorted(orphans))


def clear_topics(link: MqttLink, topics: list[str], timeout: float = 60.0) -> None:
    """Remove retained messages: an empty retained message on each topic."""
    wait_acked([publish_retained(link, topic, b"") for topic in topics], link, timeout)


def clear_bundle(link: MqttLink, topics: Topics, index: ChunkIndex, timeout: float = 60.0) -> None:
    """Remove a bundle's retained chunks and index from the broker."""
    infos = [publish_retained(link, topics.chunk(index.sha256, i), b"") for i in range(len(index.chunks))]
    infos.append(publish_retained(link, topics.index(index.sha256), b""))
    wait_acked(infos, link, timeout)
