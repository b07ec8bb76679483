"""`agent.daemon.totals`: the line and zone totals kept in a real outbox file across a restart
(a second sink and a second outbox on the same file), in one transaction, and the
``reset-counts`` command's answer."""

from __future__ import annotations

from pathlib import Path

from testkit.events import camera, run, square

from agent.config.models import EventsSection, OutboxSection
from agent.daemon.totals import KeptTotals
from agent.mqtt.outbox import Outbox, SavedCount
from agent.serving.events import EventSink
from pipelines.sources.synthetic import CLASS_NAMES


def _sink(wall: list[float], counted: list[int]) -> EventSink:
    return EventSink(EventsSection(), lambda: list(CLASS_NAMES), lambda e: None, [camera()], lambda: wall[0],
                     counted=lambda: counted.append(1))  # fmt: skip


def test_totals_are_kept_on_each_change_and_counted_on_after_a_restart(tmp_path: Path) -> None:
    wall, changed = [5000.0], list[int]()
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    first = _sink(wall, changed)
    kept = KeptTotals(outbox, first)
    kept.restore()
    assert first.since == 5000.0, "nothing kept yet: counting from this start"
    run(first, [square(100, 200 + 4 * i) for i in range(20)])  # down across the door, into the bay
    kept.save()
    outbox.close()

    wall[0] = 9000.0
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())  # the next start, on the same file
    assert outbox.counts() == [
        SavedCount("cam0", "line:door", 1, 0, 5000.0),
        SavedCount("cam0", "zone:bay", 1, 0, 5000.0),
    ]
    second = _sink(wall, changed)
    KeptTotals(outbox, second).restore()
    assert second.since == 5000.0, "counting since the first start, not this one"
    assert [(t.kind, t.name, t.a, t.b) for t in second.totals()] == [("line", "door", 1, 0), ("zone", "bay", 1, 0)]
    outbox.close()


def test_rows_of_another_kind_are_left_out_and_the_earliest_start_is_kept(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    outbox.save_counts([SavedCount("cam0", "line:door", 3, 2, 700.0), SavedCount("cam0", "zone:bay", 5, 0, 600.0),
                        SavedCount("cam0", "gauge:door", 9, 9, 800.0)])  # fmt: skip
    sink = _sink([9000.0], [])
    KeptTotals(outbox, sink).restore()
    assert sink.since == 600.0
    assert [(t.kind, t.name, t.a, t.b) for t in sink.totals()] == [("line", "door", 3, 2), ("zone", "bay", 5, 0)]
    outbox.close()


def test_a_reset_answers_what_it_cleared_and_keeps_the_zeros(tmp_path: Path) -> None:
    wall = [5000.0]
    outbox = Outbox(tmp_path / "outbox.sqlite", OutboxSection())
    sink = EventSink(EventsSection(), lambda: list(CLASS_NAMES), lambda e: None, [camera()], lambda: wall[0])
    kept = KeptTotals(outbox, sink)
    run(sink, [square(100, 200 + 4 * i) for i in range(20)])
    kept.save()
    wall[0] = 7000.25
    answer = kept.reset()
    assert answer == {"since": 7000.25, "before": {"lines": {"door": {"in": 1, "out": 0}},
                                                    "zones": {"bay": {"now": 1, "total": 1}}}}  # fmt: skip
    kept.save()
    assert [(c.name, c.a, c.b, c.since) for c in outbox.counts()] == [("line:door", 0, 0, 7000.25),
                                                                      ("zone:bay", 0, 0, 7000.25)]  # fmt: skip
    outbox.close()
