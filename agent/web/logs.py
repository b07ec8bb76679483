"""The daemon's recent log lines for the page: `RecentLogs`, a logging handler with a ring.

The server adds it to the root logger while it runs and removes it when it stops; the page
shows the lines newest last. Records are formatted when they arrive (any thread), so a record
whose arguments change later still reads as it was logged. Thread-safe (the handler's lock).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class LogLine:
    ts: float  # Unix seconds
    level: str  # INFO, WARNING, ...
    logger: str
    message: str


class RecentLogs(logging.Handler):
    """The last `size` records at `level` or above."""

    def __init__(self, size: int = 200, level: int = logging.INFO) -> None:
        super().__init__(level)
        self._lines: deque[LogLine] = deque(maxlen=size)
        self._ring = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                message += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
            line = LogLine(record.created, record.levelname, record.name, message)
        except Exception:  # a record that cannot be formatted must not break the daemon
            self.handleError(record)
            return
        with self._ring:
            self._lines.append(line)

    def to_json(self) -> list[dict[str, Any]]:
        with self._ring:
            return [asdict(line) for line in self._lines]
