"""The line and zone totals across restarts (docs/analytics.md): kept in the outbox's file (one
transaction for all of them), restored before the cameras start, and set to zero by the signed
``reset-counts`` command.

A total is kept as an `agent.mqtt.outbox.SavedCount` named ``line:<name>`` or ``zone:<name>``
with the camera it belongs to and the time counting started (Unix seconds).

Threads: `save` runs on the cameras' inference threads (after a frame changed a total) and at
the stop, under one lock; `restore` before the cameras start; `reset` on the commands thread.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from agent.mqtt.outbox import Outbox, SavedCount
from agent.serving.events import EventSink, SavedTotal
from agent.snapshot import AgentSnapshot

log = logging.getLogger(__name__)


class KeptTotals:
    """`events`' line and zone totals kept in `outbox`."""

    def __init__(self, outbox: Outbox, events: EventSink) -> None:
        self.outbox, self.events = outbox, events
        self._lock = threading.Lock()

    def restore(self) -> None:
        """Counting goes on from the totals kept before this start, since the earliest of their
        start times; rows of another kind than a line or a zone are left out."""
        saved = self.outbox.counts()
        totals = []
        for count in saved:
            kind, _, name = count.name.partition(":")
            if kind == "line":
                totals.append(SavedTotal(count.pipeline, "line", name, count.a, count.b))
            elif kind == "zone":
                totals.append(SavedTotal(count.pipeline, "zone", name, count.a, count.b))
        if saved:
            self.events.restore(totals, min(count.since for count in saved))

    def save(self) -> None:
        """Keep every total now, in one transaction: a kill keeps every crossing counted before it."""
        with self._lock:
            since = self.events.since
            rows = [SavedCount(t.camera, f"{t.kind}:{t.name}", t.a, t.b, since) for t in self.events.totals()]
            self.outbox.save_counts(rows, replace=True)

    def reset(self) -> dict[str, Any]:
        """The ``reset-counts`` command: every total to zero from now; answers the new `since`
        (Unix seconds, to the ms) and the totals it cleared (``lines`` / ``zones`` by name)."""
        before = AgentSnapshot.analytics_of(tuple(self.events.counts()))
        since = self.events.reset()
        log.info("reset-counts: the line and zone totals count from zero again")
        return {"since": round(since, 3), "before": before}
