"""`pipelines.worker.Worker`: turns and their waits, failed turns survived (counted, logged
sparingly, paced by the backoff), a clean end, an end by `SystemExit`, a stop that drains or
times out, and the heartbeat on an injected clock."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator

import pytest
from testkit.control import Clock
from testkit.net import wait_until

from agent.snapshot import judge_health
from pipelines.backoff import Backoff
from pipelines.worker import DONE, LOG_EVERY_S, LoopState, Worker


class Attempts(Backoff):
    """A backoff that waits nothing and records which attempt each delay was for."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: list[int] = []

    def next_delay(self) -> float:
        self.attempts.append(self._attempt)
        self._attempt += 1
        return 0.0


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop(10)


def test_each_turn_says_how_long_to_wait_and_wake_cuts_the_wait_short(workers: list[Worker]) -> None:
    turns: list[int] = []
    worker = Worker("ticker", lambda: turns.append(1) or 3600.0, described="the ticker", budget_s=1.0)
    workers.append(worker.start())
    assert worker.started and worker._thread is not None and worker._thread.name == "ticker"
    wait_until(lambda: len(turns) == 1, 10, "the first turn, at once")
    worker.wake()
    wait_until(lambda: len(turns) == 2, 10, "a woken turn long before the hour")
    assert worker.stop(10) and not worker.alive and not worker.started


def test_a_failed_turn_is_counted_and_paced_and_a_good_turn_clears_it(
    workers: list[Worker], caplog: pytest.LogCaptureFixture
) -> None:
    results: queue.Queue[Exception | None] = queue.Queue()
    done = threading.Event()

    def turn() -> float | None:
        while True:
            try:
                outcome = results.get(timeout=0.05)
                break
            except queue.Empty:
                if worker.stopping.is_set():
                    return DONE
        if outcome is None:
            done.set()
            return 0.0
        raise outcome

    backoff = Attempts()
    worker = Worker("flaky", turn, described="the flaky loop", budget_s=None, backoff=backoff)
    workers.append(worker.start())
    for outcome in (OSError(24, "Too many open files"), OSError(24, "Too many open files"), None):
        results.put(outcome)
    wait_until(done.is_set, 10, "the good turn")
    wait_until(lambda: worker.state().failing is None, 10, "the good turn to clear the failure")
    assert worker.alive and worker.state() == LoopState("the flaky loop", failures=2)
    results.put(RuntimeError("again"))
    wait_until(lambda: worker.state().failures == 3, 10, "the third failure")
    assert backoff.attempts == [0, 1, 0], "the backoff grows with failures in a row and starts over after a good turn"
    assert worker.state().failing == "RuntimeError: again"
    problems = judge_health((), None, (worker.state(),), 60.0).problems
    assert problems == ("the flaky loop fails its turns (3 so far) and keeps trying: RuntimeError: again",)
    assert [r.levelno for r in caplog.records if r.name == "pipelines.worker"].count(logging.ERROR) == 1, (
        "one traceback per LOG_EVERY_S, the others counted"
    )


def test_failures_are_logged_at_most_once_a_window_with_how_many_were_held_back(
    workers: list[Worker], caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(0.0)
    failed = threading.Semaphore(0)
    go = threading.Semaphore(0)

    def turn() -> float | None:
        while not go.acquire(timeout=0.05):
            if worker.stopping.is_set():
                return DONE
        failed.release()
        raise ValueError("bad frame")

    worker = Worker("noisy", turn, described="the noisy loop", budget_s=None, monotonic=clock, backoff=Attempts())
    workers.append(worker.start())

    def fail(times: int) -> None:
        for _ in range(times):
            go.release()
            assert failed.acquire(timeout=10)
        wait_until(lambda: worker.state().failures == count[0] + times, 10, "the failures counted")
        count[0] += times

    count = [0]
    fail(5)
    clock.now += LOG_EVERY_S - 0.5
    fail(5)
    clock.now += 0.5
    fail(1)
    lines = [r.getMessage() for r in caplog.records if r.name == "pipelines.worker"]
    assert lines == [
        "the noisy loop: a turn failed, trying again",
        "the noisy loop: a turn failed, trying again (9 more failed turns not logged)",
    ]
    assert all(r.exc_info is not None for r in caplog.records if r.name == "pipelines.worker"), "with the traceback"


def test_done_ends_the_thread_cleanly_and_system_exit_ends_it_with_a_reason(
    workers: list[Worker], caplog: pytest.LogCaptureFixture
) -> None:
    once = Worker("job", lambda: DONE, described="the job", budget_s=None)
    workers.append(once.start())
    assert once.join(10)
    assert once.state() == LoopState("the job"), "a job that ended by itself is no problem"

    def leave() -> float:
        raise SystemExit("asked to leave")

    ended = Worker("leaver", leave, described="the leaver", budget_s=None)
    ended.start()
    assert ended.join(10)
    assert ended.state().ended == "SystemExit: asked to leave"
    assert judge_health((), None, (ended.state(),), 60.0).problems == (
        "the leaver is not running: SystemExit: asked to leave",
    )
    assert any(r.levelno == logging.CRITICAL and "the leaver" in r.getMessage() for r in caplog.records)


def test_a_thread_that_does_not_stop_in_time_is_reported_until_it_ends(
    workers: list[Worker], caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(10.0)
    release = threading.Event()
    entered = threading.Event()

    def stuck() -> float:
        entered.set()
        release.wait(30)
        return 0.0

    worker = Worker("stuck", stuck, described="the stuck loop", budget_s=None, monotonic=clock)
    workers.append(worker.start())
    assert entered.wait(10)
    assert worker.stop(0.05) is False
    assert "the stuck loop (thread stuck) did not stop within 0 s" in caplog.text
    clock.now += 7.0
    assert worker.state().unstopped == 7.0
    assert judge_health((), None, (worker.state(),), 60.0).problems == (
        "the stuck loop was asked to stop 7 s ago and is still running",
    )
    release.set()
    assert worker.join(10)
    assert judge_health((), None, (worker.state(),), 60.0).ok, "it ended after all"


def test_stop_with_finish_lets_the_queue_drain_to_its_marker(workers: list[Worker]) -> None:
    work: queue.Queue[int | None] = queue.Queue()
    handled: list[int] = []

    def turn() -> float | None:
        item = work.get(timeout=5)
        if item is None:
            return DONE
        handled.append(item)
        return 0.0

    worker = Worker("drain", turn, described="the drain", budget_s=None)
    for item in (1, 2, 3, None):
        work.put(item)
    workers.append(worker.start())
    assert worker.stop(10, finish=True)
    assert handled == [1, 2, 3], "what was queued before the marker was handled"


def test_the_heartbeat_promises_each_wait_and_each_turn_on_the_injected_clock(workers: list[Worker]) -> None:
    clock = Clock(100.0)
    turns: list[str] = []
    long_turn, hold = threading.Event(), threading.Event()

    def turn() -> float:
        if long_turn.is_set():
            worker.beat(50.0)  # a long turn moves its promise
            turns.append("long")
            hold.wait(30)
        else:
            clock.now += 10.0  # the turn took 10 s
            turns.append("turn")
        return 3600.0

    worker = Worker("beating", turn, described="the beating loop", budget_s=5.0, monotonic=clock)
    workers.append(worker.start(delay_s=10.0))
    assert worker.state().stalled_s == 0.0
    clock.now = 100.0 + 10.0 + 3.0
    assert worker.state().stalled_s == 3.0, "past the first turn it promised after its delay"
    worker.wake()
    wait_until(lambda: turns == ["turn"] and worker.state().stalled_s == 0.0, 10, "the wait promised after the turn")
    clock.now = 123.0 + 3600.0 + 4.0
    assert worker.state().stalled_s == 4.0, "past the end of its wait"
    long_turn.set()
    worker.wake()
    wait_until(lambda: turns[-1] == "long", 10, "the long turn")
    assert worker.state().stalled_s == 0.0
    clock.now += 50.0 + 1.0
    assert worker.state().stalled_s == 1.0, "past the long turn's own promise"
    hold.set()
    without = Worker("free", lambda: 1.0, described="the free loop", budget_s=None, monotonic=clock)
    workers.append(without.start())
    clock.now += 1000.0
    assert without.state().stalled_s == 0.0, "no budget: no promise to break"
