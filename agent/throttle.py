"""Pacing what outsiders can cause: `TokenBucket` (a rate with a burst) and `ThrottledLog` (a
log line that repeats at most once per window, with how many were held back).

An anonymous client on the broker, a hostile desired document, a link that refuses a download
or a page's visitor can each cause a log line per message; without a bound, 20,000 refused
documents in half a second write 20,000 lines and wipe every ring that keeps recent lines (the
page's). Both take an injected monotonic `clock` (seconds); `ThrottledLog` is thread-safe, a
`TokenBucket` is guarded by its caller (`agent.daemon.command_service.RateLimits` holds a lock).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class TokenBucket:
    """`rate` events a second on average, `burst` at once (times from `clock`, seconds). Not
    thread-safe on its own: callers that share one hold a lock around `take`."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens, self._at = float(burst), clock()

    def take(self) -> bool:
        """Take one token: True when there was one."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def retry_after(self) -> float:
        """Seconds until the next token (0 when one is there now)."""
        now = self._clock()
        tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        return 0.0 if tokens >= 1 else (1 - tokens) / self.rate


class _Windows:
    """At most one pass per `every_s` seconds per key, counting what is held back. Thread-safe."""

    def __init__(self, every_s: float, clock: Callable[[], float]) -> None:
        self.every_s, self._clock = every_s, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def admit(self, key: str) -> int | None:
        """None: `key` passed less than `every_s` ago, held back (and counted); else how many of
        `key` were held back since it last passed."""
        now = self._clock()
        with self._lock:
            if now - self._last.get(key, -self.every_s) < self.every_s:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._held.pop(key, 0)


class ThrottledLog:
    """Logs a recurring line at most once per `every_s` seconds per key, with how many like it
    were held back since the last one it let through ("(N more like it not logged)")."""

    def __init__(self, logger: logging.Logger, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self._log, self.every_s = logger, every_s
        self._windows = _Windows(every_s, clock)

    def log(self, level: int, key: str, message: str, *args: object, exc_info: bool = False) -> bool:
        """Log `message % args` at `level` (with the exception being handled: `exc_info`)
        unless a line of `key` went out less than `every_s` ago; True when it was logged. Keys
        are a caller's fixed words, never taken from what an outsider sent (each key is kept)."""
        held = self._windows.admit(key)
        if held is None:
            return False
        self._log.log(level, message + (f" ({held} more like it not logged)" if held else ""), *args, exc_info=exc_info)
        return True

    def warning(self, key: str, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, message, *args)

    def error(self, key: str, message: str, *args: object) -> bool:
        return self.log(logging.ERROR, key, message, *args)


class ThrottleFilter(logging.Filter):
    """A logging filter for a logger whose lines outsiders can cause and whose code is not ours
    (asyncio's accept errors): each message template passes at most once per `every_s` seconds,
    with how many like it were held back since. Thread-safe."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._windows = _Windows(every_s, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        held = self._windows.admit(str(record.msg))
        if held is None:
            return False
        if held:
            record.msg = f"{record.msg} ({held} more like it not logged)"
        return True
