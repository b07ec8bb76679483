"""`agent.mqtt.outbox`: messages kept in a real SQLite file across a SIGKILL, ids and sequence
numbers, the bounds by bytes and age under a simulated six-hour outage (an injected clock), the
priorities when full, a corrupt file moved aside, a refused write counted (not when the caller
keeps it in memory), a file deleted or replaced under it made again with its backlog, the file
shrinking back under max_mb after thinning, totals saved."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent.config.models import OutboxSection
from agent.mqtt.outbox import MIB, Outbox, SavedCount, peek, with_ids


class Clock:
    """An injected wall clock (Unix seconds)."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def document(kind: str, i: int, size: int = 0) -> bytes:
    return json.dumps({"type": kind, "i": i, "pad": "x" * size}, separators=(",", ":")).encode()


def on_disk(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal")) if p.exists())


def test_with_ids_puts_the_id_and_sequence_first() -> None:
    assert json.loads(with_ids(b'{"a":1}', "abc", 7, 3)) == {"msg_id": "abc", "seq": 7, "topic_seq": 3, "a": 1}
    assert list(json.loads(with_ids(b'{"a":1}', "abc", 7, 3))) == ["msg_id", "seq", "topic_seq", "a"]
    assert json.loads(with_ids(b"{}", "abc", 7, 3)) == {"msg_id": "abc", "seq": 7, "topic_seq": 3}
    with pytest.raises(ValueError):
        with_ids(b"[1]", "abc", 7, 3)


def test_messages_keep_their_order_ids_and_sequence_numbers_across_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path, OutboxSection())
    first = [outbox.append("event", "edge/d/events", document("event", i)) for i in range(5)]
    assert all(m is not None for m in first)
    assert [m.seq for m in first if m] == [1, 2, 3, 4, 5]
    assert len({m.msg_id for m in first if m}) == 5
    outbox.acked([m for m in first[:3] if m])
    outbox.close()
    again = Outbox(path, OutboxSection())
    waiting = again.pending(0, 100)
    assert [m.seq for m in waiting] == [4, 5], "acknowledged messages are gone, the rest survived"
    assert [json.loads(m.payload)["msg_id"] for m in waiting] == [m.msg_id for m in first[3:] if m]
    later = again.append("telemetry", "edge/d/telemetry", document("telemetry", 0))
    assert later is not None and later.seq == 6, "sequence numbers are never reused, even after deletes"
    assert json.loads(later.payload)["seq"] == 6
    assert [m.seq for m in again.pending(4, 100)] == [5, 6], "pending(after) starts past `after`"
    assert again.stats().messages == 3 and again.stats().last_seq == 6


def test_each_topic_counts_its_own_sequence_across_drops_and_a_reopen(tmp_path: Path) -> None:
    """Issue 37: `seq` runs over the three topics, so a consumer of `events` alone saw a gap for
    every telemetry summary between two events. `topic_seq` counts each topic's own messages:
    contiguous on a topic whatever the others do, kept across a reopen, and a gap in it is a
    message of that topic the outbox dropped."""
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path, OutboxSection())
    made = []
    for i in range(3):
        made.append(outbox.append("event", "edge/d/events", document("event", i)))
        made.append(outbox.append("telemetry", "edge/d/telemetry", document("telemetry", i)))
    assert all(m is not None for m in made)
    sent = [json.loads(m.payload) for m in made if m]
    assert [(d["seq"], d["topic_seq"]) for d in sent if d["type"] == "event"] == [(1, 1), (3, 2), (5, 3)]
    assert [(d["seq"], d["topic_seq"]) for d in sent if d["type"] == "telemetry"] == [(2, 1), (4, 2), (6, 3)]
    outbox.acked([m for m in made if m])
    outbox.close()
    again = Outbox(path, OutboxSection())
    later = again.append("event", "edge/d/events", document("event", 3))
    other = again.append("event", "edge/e/events", document("event", 0))
    assert later is not None and json.loads(later.payload)["topic_seq"] == 4, "kept across a reopen, after deletes"
    assert other is not None and json.loads(other.payload)["topic_seq"] == 1, "another topic, another sequence"


def test_peek_reads_an_outbox_named_by_a_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`edge-agent doctor` beside the demo's agent, whose agent.yaml names a relative state_dir
    (``demo-out/fleet-state``): the read-only look raised "relative path can't be expressed as a
    file URI" and ended the doctor in a traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "state").mkdir()
    outbox = Outbox(Path("state/outbox.sqlite"), OutboxSection())
    outbox.append("event", "edge/d/events", document("event", 0))
    outbox.close()
    stats = peek(Path("state/outbox.sqlite"), OutboxSection(), 1_700_000_000.0)
    assert stats is not None and stats.messages == 1 and stats.last_seq == 1
    assert peek(Path("state/none.sqlite"), OutboxSection(), 1_700_000_000.0) is None


def test_what_was_appended_survives_a_sigkill(tmp_path: Path) -> None:
    """A child process appends 200 messages with synchronous=normal and is killed with SIGKILL
    right after the last append returned: every one is in the file."""
    path = tmp_path / "outbox.sqlite"
    child = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from agent.config.models import OutboxSection
        from agent.mqtt.outbox import Outbox
        outbox = Outbox(Path({str(path)!r}), OutboxSection(synchronous="normal"))
        for i in range(200):
            assert outbox.append("event", "edge/d/events", b'{{"i":%d}}' % i) is not None
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    outbox = Outbox(path, OutboxSection())
    assert [json.loads(m.payload)["i"] for m in outbox.pending(0, 1000)] == list(range(200))
    assert outbox.problem is None


@pytest.mark.slow
def test_a_six_hour_outage_stays_under_max_mb_and_thins_telemetry_before_events(tmp_path: Path) -> None:
    """Six simulated hours without a broker: a telemetry summary (2 KB) every 30 s, an object
    event (600 B) every 6 s, a deployment report every hour, into a 1 MiB outbox. The file
    (with its WAL) never exceeds 1 MiB; telemetry is dropped first, and thinned (what stays still spans
    the outage); events go only once telemetry is thin, deployment reports never; every drop is
    counted."""
    clock = Clock()
    start = clock.now
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path, OutboxSection(max_mb=1, max_age_h=24), clock)
    largest = 0
    first_event_drop_at_telemetry: int | None = None
    for second in range(0, 6 * 3600, 6):
        clock.now = start + second
        assert outbox.append("event", "edge/d/events", document("event", second, 600)) is not None
        if second % 30 == 0:
            assert outbox.append("telemetry", "edge/d/telemetry", document("telemetry", second, 2000)) is not None
        if second % 3600 == 0:
            assert outbox.append("deployment", "edge/d/deployments", document("deployment", second)) is not None
        largest = max(largest, on_disk(path))
        if first_event_drop_at_telemetry is None and outbox.stats().dropped.event:
            first_event_drop_at_telemetry = sum(1 for m in outbox.pending(0, 10**6) if m.kind == "telemetry")
    stats = outbox.stats()
    assert largest <= MIB, f"the file reached {largest} bytes"
    assert stats.bytes <= MIB
    assert stats.dropped.telemetry > 0 and stats.dropped.event > 0
    assert stats.dropped.deployment == 0
    assert first_event_drop_at_telemetry is not None and first_event_drop_at_telemetry <= 2, (
        "no event went while more than a trace of telemetry was left"
    )
    assert stats.dropped.full == stats.dropped.telemetry + stats.dropped.event
    kept = outbox.pending(0, 10**6)
    assert [m.seq for m in kept] == sorted(m.seq for m in kept)
    assert sum(1 for m in kept if m.kind == "deployment") == 6, "every deployment report is kept"
    assert stats.messages == len(kept)
    assert stats.oldest_age_s == pytest.approx(clock.now - kept[0].created)
    total = 6 * 3600 // 6 + 6 * 3600 // 30 + 6
    assert stats.messages + stats.dropped.total == total, "every message is either kept or counted as dropped"


def test_telemetry_is_thinned_not_cut_from_the_front(tmp_path: Path) -> None:
    clock = Clock()
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection(max_mb=1), clock)
    for i in range(1500):
        clock.now += 10
        outbox.append("telemetry", "edge/d/telemetry", document("telemetry", i, 2000))
    kept = [json.loads(m.payload)["i"] for m in outbox.pending(0, 10**6)]
    assert outbox.stats().dropped.telemetry > 700
    assert kept[0] == 0, "the outage's first summary stays: the oldest are thinned, not cut"
    assert kept[-1] == 1499


def test_messages_past_max_age_are_dropped_and_counted(tmp_path: Path) -> None:
    clock = Clock()
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection(max_age_h=1), clock)
    outbox.append("event", "edge/d/events", document("event", 0))
    outbox.append("telemetry", "edge/d/telemetry", document("telemetry", 0))
    clock.now += 3599
    outbox.append("event", "edge/d/events", document("event", 1))
    assert outbox.stats().messages == 3, "an hour less a second is not too old"
    clock.now += 2
    outbox.bound()
    stats = outbox.stats()
    assert stats.messages == 1
    assert (stats.dropped.expired, stats.dropped.event, stats.dropped.telemetry) == (2, 1, 1)


def test_a_corrupt_file_is_moved_aside_with_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    path.write_bytes(b"this is not a database" * 300)
    outbox = Outbox(path, OutboxSection(), Clock(1_700_000_123.0))
    assert outbox.problem is not None and "moved aside" in outbox.problem
    aside = tmp_path / "outbox.sqlite.corrupt-1700000123"
    assert aside.read_bytes().startswith(b"this is not a database")
    assert outbox.append("event", "edge/d/events", b"{}") is not None, "a new file works"
    assert outbox.stats().problem == outbox.problem


def test_a_refused_write_is_counted_and_never_raises(tmp_path: Path) -> None:
    """SQLite's own page limit stands in for a full disk (the same SQLITE_FULL error)."""
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    pages = outbox._db.execute("PRAGMA page_count").fetchone()[0]
    outbox._db.execute(f"PRAGMA max_page_count={pages}")
    tried = [outbox.append("event", "edge/d/events", document("event", i, 3000)) for i in range(8)]
    refused = tried.count(None)
    assert refused >= 6, "the file cannot grow: appends are refused"
    stats = outbox.stats()
    assert stats.dropped.unwritten == refused and stats.problem is not None and "cannot write" in stats.problem
    outbox._db.execute("PRAGMA max_page_count=1000000")
    assert outbox.append("event", "edge/d/events", document("event", 9)) is not None
    stats = outbox.stats()
    assert stats.dropped.unwritten == refused, "the count survives the recovery (now in the file)"
    assert stats.problem is None, "the problem clears once writes work again"


def test_a_refused_write_kept_in_memory_by_the_caller_is_not_counted(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    pages = outbox._db.execute("PRAGMA page_count").fetchone()[0]
    outbox._db.execute(f"PRAGMA max_page_count={pages}")
    tried = [outbox.append("event", "edge/d/events", document("event", i, 3000), kept_in_memory=True) for i in range(8)]
    assert tried.count(None) >= 6
    stats = outbox.stats()
    assert stats.dropped.unwritten == 0 and stats.problem is not None and "cannot write" in stats.problem
    outbox._db.execute("PRAGMA max_page_count=1000000")
    assert outbox.append("telemetry", "edge/d/telemetry", document("telemetry", 0)) is not None
    stats = outbox.stats()
    assert (stats.dropped.unwritten, stats.problem) == (0, None)


def test_an_outbox_deleted_while_running_is_made_again_with_its_backlog(tmp_path: Path) -> None:
    """Someone removes the file (and its journals) under the running agent: the next reading
    notices, writes what the open connection still holds into a new file and says so."""
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path, OutboxSection(), Clock(1_700_000_000.0))
    sent = [outbox.append("event", "edge/d/events", document("event", i)) for i in range(5)]
    outbox.acked([m for m in sent[:2] if m])
    outbox.save_counts([SavedCount("cam0", "door", 3, 1, 100.0)])
    for part in tmp_path.glob("outbox.sqlite*"):
        part.unlink()
    assert [m.seq for m in outbox.pending(0, 100)] == [3, 4, 5]
    assert path.exists(), "made again at the next reading"
    stats = outbox.stats()
    assert stats.problem is not None and "deleted" in stats.problem and "3 message(s)" in stats.problem
    assert outbox.recreated == 1 and stats.recreated == 1, "counted where telemetry and /metrics read it"
    later = outbox.append("event", "edge/d/events", document("event", 5))
    assert later is not None and later.seq == 6, "sequence numbers go on, never reused"
    assert outbox.stats().problem == stats.problem, "said once, and kept in view"
    outbox.close()
    again = Outbox(path, OutboxSection())
    assert [m.seq for m in again.pending(0, 100)] == [3, 4, 5, 6], "the backlog is on disk again"
    assert again.counts() == [SavedCount("cam0", "door", 3, 1, 100.0)]
    again.close()


def test_an_outbox_replaced_while_running_is_moved_aside_and_made_again(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path, OutboxSection(), Clock(1_700_000_000.0))
    outbox.append("event", "edge/d/events", document("event", 0))
    path.unlink()
    path.write_bytes(b"someone else's file")
    assert len(outbox.pending(0, 100)) == 1
    assert (tmp_path / "outbox.sqlite.replaced-1700000000").read_bytes() == b"someone else's file"
    assert outbox.problem is not None and "replaced" in outbox.problem
    outbox.close()
    assert len(Outbox(path, OutboxSection()).pending(0, 100)) == 1


def test_the_file_shrinks_back_under_max_mb_after_thinning(tmp_path: Path) -> None:
    """Messages bigger than the rest grow the file; once they are dropped, the space comes back."""
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path, OutboxSection(max_mb=2))
    for i in range(3):
        outbox.append("event", "edge/d/events", document("event", i, 5_000_000))
    for i in range(200):
        outbox.append("telemetry", "edge/d/telemetry", document("telemetry", i, 2000))
    assert outbox.stats().messages > 0
    assert on_disk(path) <= 2 * MIB, f"{on_disk(path)} bytes on disk for max_mb 2"
    outbox.close()


def test_a_file_made_before_is_switched_to_reclaim_space_once(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path, OutboxSection())
    outbox.append("event", "edge/d/events", document("event", 0))
    outbox._db.execute("PRAGMA auto_vacuum=NONE")
    outbox._db.execute("VACUUM")  # as a file made before auto_vacuum was set
    assert outbox._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    outbox.close()
    again = Outbox(path, OutboxSection())
    assert again._db.execute("PRAGMA auto_vacuum").fetchone()[0] == 2, "incremental"
    assert [m.seq for m in again.pending(0, 10)] == [1], "the messages stay"
    again.close()


def test_an_unopenable_state_directory_keeps_messages_in_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")
    outbox = Outbox(blocker / "outbox.sqlite", OutboxSection())
    assert outbox.problem is not None and "in memory" in outbox.problem
    assert outbox.append("event", "edge/d/events", b'{"a":1}') is not None
    assert len(outbox.pending(0, 10)) == 1


def test_totals_are_saved_and_a_reset_replaces_them(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    outbox = Outbox(path, OutboxSection())
    outbox.save_counts([SavedCount("cam0", "door", 3, 1, 100.0), SavedCount("cam0", "yard", 7, 0, 100.0)])
    outbox.save_counts([SavedCount("cam0", "door", 4, 1, 100.0)])
    outbox.close()
    again = Outbox(path, OutboxSection())
    assert again.counts() == [SavedCount("cam0", "door", 4, 1, 100.0), SavedCount("cam0", "yard", 7, 0, 100.0)]
    again.save_counts([SavedCount("cam0", "door", 0, 0, 200.0)], replace=True)
    assert again.counts() == [SavedCount("cam0", "door", 0, 0, 200.0)]
