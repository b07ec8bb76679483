"""The daemon's recent log lines for the page: `RecentLogs`, a logging handler with two rings.

The server adds it to the root logger while it runs and removes it when it stops; the page
shows the lines newest last. Records are formatted when they arrive (any thread), so a record
whose arguments change later still reads as it was logged. Audit lines (a record logged with
``extra=AUDIT``: the page's actions, who asked for them) have a ring of their own, so a flood
of other lines, which an outsider may cause, cannot push them out. Thread-safe (the handler's
lock).
"""

from __future__ import annotations

import heapq
import logging
import threading
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from pipelines.sources.frames import CredentialsFilter, redact_credentials

#: ``log.warning(..., extra=AUDIT)`` marks a record as an audit line
AUDIT: dict[str, object] = {"audit": True}


@dataclass(frozen=True)
class LogLine:
    ts: float  # Unix seconds
    level: str  # INFO, WARNING, ...
    logger: str
    message: str
    audit: bool = False  # a page action's line, kept in the audit ring


class RecentLogs(logging.Handler):
    """The last `size` records at `level` or above, and apart from them the last `audit_size`
    audit lines."""

    def __init__(self, size: int = 200, level: int = logging.INFO, audit_size: int = 50) -> None:
        super().__init__(level)
        self.addFilter(CredentialsFilter())  # a camera's password never reaches the page
        self._lines: deque[LogLine] = deque(maxlen=size)
        self._audit: deque[LogLine] = deque(maxlen=audit_size)
        self._ring = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message += redact_credentials(f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})")
            audit = getattr(record, "audit", False) is True
            line = LogLine(record.created, record.levelname, record.name, message, audit)
        except Exception:  # a record that cannot be formatted must not break the daemon
            self.handleError(record)
            return
        with self._ring:
            (self._audit if audit else self._lines).append(line)

    def to_json(self) -> list[dict[str, Any]]:
        """Both rings as one list, oldest first (``audit`` says which ring a line is from)."""
        with self._ring:
            lines = list(heapq.merge(self._audit, self._lines, key=lambda line: line.ts))
        return [asdict(line) for line in lines]
