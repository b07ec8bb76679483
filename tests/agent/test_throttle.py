"""`agent.throttle`: a token bucket's burst, rate and wait, and a log line held back per key with
its count, on an injected clock."""

from __future__ import annotations

import logging

import pytest
from testkit.control import Clock

from agent.throttle import ThrottledLog, TokenBucket


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
