"""Jittered exponential backoff, shared by everything that reconnects: camera sources, the MQTT
link, bundle downloads. Not thread-safe: each reconnecting loop owns one."""

from __future__ import annotations

import random


class Backoff:
    """Jittered exponential backoff: ``initial * factor**n`` capped at `maximum`, times a random
    factor in ``1 ± jitter``."""

    def __init__(
        self,
        initial: float = 0.5,
        maximum: float = 30.0,
        factor: float = 2.0,
        jitter: float = 0.2,
        rng: random.Random | None = None,
    ) -> None:
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self._rng = rng or random.Random()
        self._attempt = 0

    def next_delay(self) -> float:
        base = min(self.maximum, self.initial * self.factor**self._attempt)
        self._attempt += 1
        return base * (1 + self._rng.uniform(-self.jitter, self.jitter))

    def reset(self) -> None:
        self._attempt = 0
