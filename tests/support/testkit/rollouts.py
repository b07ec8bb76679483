"""Staged rollout schedules as the tests make them."""

from __future__ import annotations

from typing import Any

from agent.mqtt.rollout_schedule import FailureLimit, Rollout

HOUR = 3600.0


def schedule(**changes: Any) -> Rollout:
    values: dict[str, Any] = {
        "waves": [10, 50, 100],
        "start": 1000.0,
        "interval_s": HOUR,
        "max_failures": FailureLimit(devices=0),
    }
    return Rollout(**{**values, **changes})
