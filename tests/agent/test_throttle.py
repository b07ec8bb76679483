"""`agent.throttle`: a token bucket's burst, rate and wait, and a log line held back per key with
its count, on an injected clock."""

from __future__ import annotations

import logging

import pytest
from testkit.control import Clock

from agent.throttle import ThrottledLog, ThrottleFilter, TokenBucket


def test_a_bucket_gives_its_burst_then_its_rate_and_says_how_long_to_wait() -> None:
    clock = Clock(0.0)
    bucket = TokenBucket(rate=1 / 30, burst=2, clock=clock)
    assert [bucket.take() for _ in range(4)] == [True, True, False, False]
    assert bucket.retry_after() == pytest.approx(30.0)
    clock.now = 29.0
    assert not bucket.take() and bucket.retry_after() == pytest.approx(1.0)
    clock.now = 30.0
    assert bucket.retry_after() == 0.0 and bucket.take() and not bucket.take()
    clock.now = 1000.0
    assert sum(bucket.take() for _ in range(10)) == 2, "an idle bucket refills to its burst, no more"


def test_throttled_log_bounds_the_lines_per_key(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(0.0)
    throttled = ThrottledLog(logging.getLogger("test.throttle"), every_s=10, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.throttle"):
        for _ in range(1000):
            throttled.warning("flood", "dropped")
        assert throttled.error("other", "refused %s", "x"), "another key has its own window"
        clock.now = 9.9
        assert not throttled.warning("flood", "dropped")
        clock.now = 10.0
        throttled.warning("flood", "dropped")
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        ("WARNING", "dropped"),
        ("ERROR", "refused x"),
        ("WARNING", "dropped (1000 more like it not logged)"),
    ]


def test_a_throttle_filter_lets_each_message_through_once_a_window_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """asyncio's accept errors: 264,162 tracebacks in 42 s when the descriptors ran out."""
    clock = Clock(0.0)
    logger = logging.getLogger("test.throttle.filter")
    flood = ThrottleFilter(every_s=60.0, clock=clock)
    logger.addFilter(flood)
    try:
        with caplog.at_level(logging.ERROR, logger="test.throttle.filter"):
            for _ in range(500):
                logger.error("socket.accept() out of system resource")
            logger.error("another %s", "template")
            clock.now = 59.9
            logger.error("socket.accept() out of system resource")
            clock.now = 60.0
            logger.error("socket.accept() out of system resource")
    finally:
        logger.removeFilter(flood)
    assert [r.getMessage() for r in caplog.records] == [
        "socket.accept() out of system resource",
        "another template",
        "socket.accept() out of system resource (500 more like it not logged)",
    ]
