"""`agent.daemon.outgoing`: what the device sends, over a real mosquitto and a real outbox file:
events naming the device, with their snapshot kept on disk in place of the crop, a deployment
step reported once, telemetry with the status from one snapshot, nothing sent without a broker,
events a full disk left in memory delivered and not counted as dropped, and the outbox sender's
thread as `health()` sees it (injected monotonic clock)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from testkit import snapshots
from testkit.broker import Broker, Watcher
from testkit.net import wait_until
from testkit.transfer import link_to

from agent.bundles.record import Deployment, State
from agent.config.models import MediaSection, OutboxSection
from agent.daemon.media import MediaStore
from agent.daemon.outgoing import SENDER, Outgoing
from agent.errors import CodedError, ErrorCode
from agent.event_values import ObjectEvent
from agent.mqtt.outbox import Outbox
from agent.mqtt.outbox_sender import OutboxSender
from agent.mqtt.protocol import Topics
from pipelines.worker import LoopState

TOPICS = Topics("edge")
EVENTS, REPORTS = TOPICS.events("d1"), TOPICS.deployments("d1")
TELEMETRY, STATUS = TOPICS.telemetry("d1"), TOPICS.status("d1")
CROP = b"\xff\xd8 a jpeg crop \xff\xd9"


def _event(object_id: str = "0123456789abcdef", crop: bytes | None = CROP) -> ObjectEvent:
    return ObjectEvent(
        "end", 1.0, "cam0", object_id, 7, "person", 0, 0.9, (1.0, 2.0, 3.0, 4.0), 12, 0.8, snapshot_jpeg=crop
    )


def test_without_a_broker_events_fill_the_page_s_list_and_the_media_store_only(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    media = MediaStore(tmp_path / "media", MediaSection())
    outgoing = Outgoing("d1", TOPICS, outbox, snapshots.snapshot, media=media)
    outgoing.event(_event())
    outgoing.telemetry()
    outgoing.deployment_report(Deployment("dep-1", "ab" * 32))
    (listed,) = outgoing.recent
    assert isinstance(listed, ObjectEvent)
    assert (listed.snapshot_jpeg, listed.snapshot) == (None, "0123456789abcdef.jpg"), "named, not carried"
    assert outgoing.media_jpeg("0123456789abcdef") == CROP
    assert outbox.stats().messages == 0, "nothing queued to send without a broker"
    with pytest.raises(CodedError) as refused:
        outgoing.media_jpeg("fedcba9876543210")
    assert refused.value.code is ErrorCode.NO_MEDIA
    outbox.close()


def test_without_a_media_store_the_crop_stays_in_the_event(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    outgoing = Outgoing("d1", TOPICS, outbox, snapshots.snapshot)
    outgoing.event(_event())
    (listed,) = outgoing.recent
    assert isinstance(listed, ObjectEvent) and listed.snapshot is None and listed.snapshot_jpeg is None
    with pytest.raises(CodedError, match="no snapshot"):
        outgoing.media_jpeg("0123456789abcdef")
    outbox.close()


def test_events_reports_and_telemetry_reach_the_broker_through_the_outbox(tmp_path: Path, broker: Broker) -> None:
    watcher = Watcher(broker, [EVENTS, REPORTS, TELEMETRY, STATUS])
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    link = link_to(broker.url).start()
    sender = OutboxSender(outbox, link, OutboxSection(send_rate=1000))
    media = MediaStore(tmp_path / "media", MediaSection())
    outgoing = Outgoing("d1", TOPICS, outbox, lambda: snapshots.snapshot(device="d1"), link, sender, media)
    sender.start()
    try:
        assert link.wait_connected(10)
        outgoing.event(_event())
        deployment = Deployment("dep-1", "ab" * 32)
        outgoing.deployment_report(deployment)
        outgoing.deployment_report(deployment)  # the same step again: not reported twice
        outgoing.deployment_report(deployment.to(State.VERIFYING))
        outgoing.telemetry()
        wait_until(lambda: len(watcher.all_json(REPORTS)) >= 2 and watcher.all_json(TELEMETRY), 30, "the messages")
        wait_until(lambda: outbox.stats().messages == 0, 10, "the outbox to forget what was acknowledged")
        (event,) = watcher.all_json(EVENTS)
        assert event["device"] == "d1" and {"msg_id", "seq"} <= set(event), "the device's, with the outbox's ids"
        assert event["snapshot"] == "0123456789abcdef.jpg" and "snapshot_jpeg" not in event
        assert [r["state"] for r in watcher.all_json(REPORTS)] == ["QUEUED", "VERIFYING"], "each step once"
        assert watcher.json(STATUS)["device"] == "d1", "telemetry brings the status along"
    finally:
        sender.stop()
        link.stop()
        watcher.close()
        outbox.close()


def test_events_the_full_disk_left_in_memory_are_delivered_and_not_counted_as_dropped(
    tmp_path: Path, broker: Broker
) -> None:
    """The outbox file cannot grow (SQLite's page limit: the same SQLITE_FULL as a full disk), so
    each event goes to the link's in-memory queue; delivered from there, none is dropped."""
    watcher = Watcher(broker, [EVENTS])
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    pages = outbox._db.execute("PRAGMA page_count").fetchone()[0]
    outbox._db.execute(f"PRAGMA max_page_count={pages}")
    link = link_to(broker.url).start()
    outgoing = Outgoing("d1", TOPICS, outbox, snapshots.snapshot, link)
    try:
        assert link.wait_connected(10)
        for i in range(4):
            outgoing.event(_event(f"{i:016x}", crop=b"x" * 20_000))
        wait_until(lambda: len(watcher.all_json(EVENTS)) == 4, 30, "the four events, from memory")
        stats = outbox.stats()
        assert stats.messages == 0 and stats.problem is not None and "cannot write" in stats.problem
        assert stats.dropped.unwritten == 0 and stats.dropped.total == 0, "delivered: not dropped"
        assert link.stats().dropped == 0
        outbox._db.execute("PRAGMA max_page_count=1000000")
        outgoing.event(_event("f" * 16, crop=None))
        stats = outbox.stats()
        assert stats.problem is None and stats.dropped.unwritten == 0, "the disk works again: nothing to count"
    finally:
        link.stop()
        watcher.close()
        outbox.close()


class Ticks:
    """An injected monotonic clock (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_sender_s_thread_as_health_sees_it(tmp_path: Path, broker: Broker, monkeypatch) -> None:
    """Health hears of the sender's own worker: nothing before a start or after a stop, how far
    it is past the turn it announced (the injected clock), and turns that fail."""
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    assert Outgoing("d1", TOPICS, outbox, snapshots.snapshot).loop() == LoopState(SENDER), "no broker, no sender"
    link, ticks = link_to(broker.url), Ticks()
    sender = OutboxSender(outbox, link, OutboxSection(), monotonic=ticks)
    outgoing = Outgoing("d1", TOPICS, outbox, snapshots.snapshot, link, sender)
    assert outgoing.loop() == LoopState(SENDER), "not started yet: nothing to say"
    failing = threading.Event()

    def turn() -> float:
        if failing.is_set():
            raise OSError(28, "No space left on device")
        return 3600.0  # then it waits an hour: only the clock moves

    monkeypatch.setattr(sender, "turn", turn)
    sender.start()
    try:
        ticks.now = 100.0 + 3600.0 + 12.5
        wait_until(lambda: outgoing.loop().stalled_s == 12.5, 10, "the sender to wait for its next turn")
        failing.set()
        sender.wake()
        wait_until(lambda: outgoing.loop().failing is not None, 10, "a failed turn")
        assert outgoing.loop().failing == "OSError: [Errno 28] No space left on device"
    finally:
        sender.stop()
    assert outgoing.loop().ended is None and outgoing.loop().stalled_s == 0.0, "stopped on purpose"
    outbox.close()


def test_an_objects_start_opens_its_clip_and_its_events_name_it(tmp_path: Path) -> None:
    """On a camera with clips, a ``start`` (right after its frame went into the ring) opens the
    clip and names it; the ``end`` repeats the name; the clip, once written, is what the
    ``media`` command and the page serve; the media store's use counts the clips."""
    import dataclasses

    import numpy as np

    from agent.config.models import CameraSection, ClipSection
    from agent.daemon.clips import ClipRecorder
    from pipelines.sources.frames import Frame

    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    media = MediaStore(tmp_path / "media", MediaSection())
    camera = CameraSection(name="cam0", source="synthetic", fps=8, clips=ClipSection(pre_s=0.25, post_s=0.25))
    clips = ClipRecorder([camera], media.folder, media.keep_clip)
    outgoing = Outgoing("d1", TOPICS, outbox, snapshots.snapshot, media=media, clips=clips)
    clips.start()
    image = np.full((48, 64, 3), 90, np.uint8)
    for i in range(3):
        clips.frame("cam0", Frame(i, i / 8, image))
    outgoing.event(dataclasses.replace(_event(crop=None), kind="start"))
    other = _event("fedcba9876543210", crop=None)  # on a camera without clips, or never started: none
    outgoing.event(other)
    for i in range(3, 6):
        clips.frame("cam0", Frame(i, i / 8, image))
    outgoing.event(_event())
    clips.stop()
    start, unclipped, end = outgoing.recent
    assert isinstance(start, ObjectEvent) and isinstance(end, ObjectEvent) and isinstance(unclipped, ObjectEvent)
    assert start.clip == end.clip == "0123456789abcdef.mp4" and unclipped.clip is None
    assert end.to_json()["clip"] == "0123456789abcdef.mp4"
    kept = outgoing.page_media("0123456789abcdef", "clip")
    assert kept is not None and kept[1] == "video/mp4" and outgoing.media_clip("0123456789abcdef") == kept[0]
    assert outgoing.page_media("0123456789abcdef", "snapshot") == (CROP, "image/jpeg")
    with pytest.raises(CodedError) as refused:
        outgoing.media_clip("fedcba9876543210")
    assert refused.value.code is ErrorCode.NO_MEDIA
    usage = outgoing.media_usage()
    assert usage is not None and usage.files == 2 and (usage.clips_written, usage.clips_dropped) == (1, 0)
    outbox.close()
