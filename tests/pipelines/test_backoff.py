"""`pipelines.backoff`: jittered exponential backoff grows, caps and resets."""

from __future__ import annotations

import random

from pipelines.backoff import Backoff


def test_backoff_grows_caps_and_resets() -> None:
    backoff = Backoff(initial=0.5, maximum=4.0, jitter=0.2, rng=random.Random(1))
    delays = [backoff.next_delay() for _ in range(8)]
    for n, delay in enumerate(delays):
        base = min(4.0, 0.5 * 2**n)
        assert base * 0.8 <= delay <= base * 1.2
    backoff.reset()
    assert backoff.next_delay() <= 0.6
