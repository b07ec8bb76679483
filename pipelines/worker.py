"""`Worker`: the one way this project owns a thread.

A worker calls its `turn` again and again on a thread of its own until `stop`. Each turn returns
how long to wait before the next (seconds; 0: at once), or `DONE` when the work is over and the
thread ends by itself. A wait ends early at `stop` or `wake`.

A turn that raises an `Exception` costs that turn, not the thread: the failure is counted, logged
(with its traceback at most once per `LOG_EVERY_S`, with how many were held back), and the next
turn comes after a jittered backoff that doubles from `RETRY_S` up to `RETRY_MAX_S` and starts
over after a good turn. A file-descriptor shortage, a sensor that vanished or a full disk thus
slows a loop down instead of ending it. Only what is not an `Exception` (`SystemExit`,
`KeyboardInterrupt`) ends the thread; `state()` says why.

Heartbeat: before each turn the worker promises its next one within `budget_s` (None: no promise,
for a loop that reports its own progress), and before each wait the wait's end; `beat(seconds)`
moves the promise from inside a long turn. `state()` says how far the thread is past it.

Stopping: `stop(timeout)` sets `stopping`, wakes a wait and joins the thread for at most `timeout`
seconds. A thread still running then is reported, as gpiozero's `GPIOThread.stop` reports its
own: logged, and `state().unstopped` says so until it ends, for the daemon's `health()` (the page,
`doctor` and `/healthz`).

Threads: `start`, `stop`, `wake`, `beat` and `state` may be called from any thread; `turn` runs on
the worker's own (daemon) thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from pipelines.backoff import Backoff

log = logging.getLogger(__name__)

#: what a turn returns when the work is over: the thread ends by itself, not as a failure
DONE: Final = None
#: the first wait after a failed turn, and the longest (seconds)
RETRY_S, RETRY_MAX_S = 1.0, 60.0
#: a failed turn's traceback is logged at most this often per worker (seconds)
LOG_EVERY_S = 60.0

Turn = Callable[[], "float | None"]


@dataclass(frozen=True)
class LoopState:
    """One of the daemon's own loops as its owner found it: `name` in words, `stalled_s` how far
    it is past the turn it announced (seconds; 0: on time), `ended` why its thread ended while it
    should run (None: it runs, or was never started), `failures` its failed turns so far and
    `failing` the last one's error while the turns since have all failed (None: the last turn
    went well), `unstopped` how long a thread asked to stop has gone on running (seconds; None:
    it stopped, or was not asked)."""

    name: str
    stalled_s: float = 0.0
    ended: str | None = None
    failures: int = 0
    failing: str | None = None
    unstopped: float | None = None


class Worker:
    """A thread named `name` that calls `turn` until stopped (see the module text); `described`
    names it in a technician's words for `state()`. `monotonic` is the clock of its heartbeat
    (seconds); `backoff` paces the turns after a failure."""

    def __init__(
        self,
        name: str,
        turn: Turn,
        *,
        described: str,
        budget_s: float | None,
        monotonic: Callable[[], float] = time.monotonic,
        backoff: Backoff | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self.name, self.described, self.budget_s = name, described, budget_s
        self._turn, self._monotonic, self._log = turn, monotonic, logger
        self._backoff = backoff or Backoff(initial=RETRY_S, maximum=RETRY_MAX_S)
        self.stopping = threading.Event()  # set by `stop`: a long turn may watch it
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._due: float | None = None  # when the thread promised to turn again (None: no promise)
        self._ended: str | None = None
        self._failures = 0
        self._failing: str | None = None
        self._logged_at: float | None = None  # when a failure's traceback was last logged
        self._held = 0  # failures not logged since
        self._stop_asked: float | None = None  # when `stop` gave up waiting for the thread

    @classmethod
    def once(cls, name: str, job: Callable[[], object], *, described: str, logger: logging.Logger = log) -> Worker:
        """A worker whose one turn runs `job` (a build, a report, a probe with a deadline): a job
        that raises is logged, not tried again, and the thread ends either way."""

        def turn() -> float | None:
            try:
                job()
            except Exception:
                logger.exception("%s failed", described)
            return DONE

        return cls(name, turn, described=described, budget_s=None, logger=logger)

    # -- control (any thread) ------------------------------------------------------------------

    def start(self, delay_s: float = 0.0) -> Worker:
        """Start the thread (again, after a `stop` or its end), its first turn `delay_s` seconds
        from now; a running one is left as it is."""
        if self.alive:
            return self
        self.stopping.clear()
        self._wake.clear()
        self._ended, self._stop_asked = None, None
        self._due = None if self.budget_s is None else self._promise(delay_s)
        self._thread = threading.Thread(target=self._run, args=(delay_s,), name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0, *, finish: bool = False) -> bool:
        """Ask the thread to stop and wait for it at most `timeout` seconds; True when it ended
        (or never ran). With `finish` the thread is let end by itself first (its turn returns
        `DONE` at a marker the owner queued, after the work before it), and told to stop only
        when `timeout` ran out. A thread that goes on is logged and shown by `state().unstopped`."""
        thread = self._thread
        if not finish or thread is None:
            self.stopping.set()
            self._wake.set()
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        self.stopping.set()
        self._wake.set()
        if thread.is_alive():
            self._stop_asked = self._monotonic()
            self._log.error("%s (thread %s) did not stop within %.0f s", self.described, self.name, timeout)
            return False
        return True

    def wake(self) -> None:
        """End the wait between two turns now (work arrived)."""
        self._wake.set()

    def beat(self, seconds: float | None) -> None:
        """From inside a turn: the next turn comes within `seconds` (None: no promise)."""
        self._due = self._promise(seconds)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for a thread that ends by itself (`DONE`); True when it has ended."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.alive

    # -- what it is doing (any thread) ---------------------------------------------------------

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def started(self) -> bool:
        """Started and not stopped since (it may have ended by itself)."""
        return self._thread is not None and not self.stopping.is_set()

    def state(self) -> LoopState:
        """The loop for `health()`: past its promise, ended, failing, or not stopping."""
        now = self._monotonic()
        if self._thread is None:
            return LoopState(self.described)
        if not self._thread.is_alive():
            ended = None if self.stopping.is_set() else self._ended
            return LoopState(self.described, ended=ended, failures=self._failures, failing=self._failing)
        unstopped = None if self._stop_asked is None else max(0.0, now - self._stop_asked)
        due = self._due
        stalled = 0.0 if due is None or self.stopping.is_set() else max(0.0, now - due)
        return LoopState(self.described, stalled, None, self._failures, self._failing, unstopped)

    # -- the thread ----------------------------------------------------------------------------

    def _promise(self, seconds: float | None) -> float | None:
        return None if seconds is None else self._monotonic() + seconds

    def _run(self, delay_s: float) -> None:
        try:
            if delay_s > 0:
                self._wake.wait(delay_s)
                self._wake.clear()
            while not self.stopping.is_set():
                self._due = self._promise(self.budget_s)
                wait = self._guarded_turn()
                if wait is DONE:
                    return
                if wait > 0 and not self.stopping.is_set():
                    self._due = None if self.budget_s is None else self._promise(wait)
                    self._wake.wait(wait)
                self._wake.clear()
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: the end, said in `state()`
            self._ended = f"{type(exc).__name__}: {exc}"
            self._log.critical("%s (thread %s) ended: %s", self.described, self.name, self._ended, exc_info=exc)

    def _guarded_turn(self) -> float | None:
        try:
            wait = self._turn()
        except Exception as exc:
            delay = self._backoff.next_delay()
            self._failed(exc)
            return delay
        if self._failing is not None:
            self._log.info("%s works again after %d failed turns", self.described, self._failures)
        self._failing = None
        self._backoff.reset()
        return wait

    def _failed(self, exc: Exception) -> None:
        """Log `exc` (its traceback at most once per `LOG_EVERY_S`), then count it: whoever sees
        the count sees the line logged, and the clock read for it."""
        now = self._monotonic()
        if self._logged_at is not None and now - self._logged_at < LOG_EVERY_S:
            self._held += 1
        else:
            more = f" ({self._held} more failed turns not logged)" if self._held else ""
            self._log.error("%s: a turn failed, trying again%s", self.described, more, exc_info=exc)
            self._logged_at, self._held = now, 0
        self._failing = f"{type(exc).__name__}: {exc}"
        self._failures += 1
