"""The governor at work: each sensor reading steps `agent.governor.policy.Governor`, and its
decision is carried out on the cameras and the fan.

- fan: set to the level's duty when it changes (a fan that fails is logged once per problem,
  reported in the governor's state, and the other actions still apply);
- FPS caps, motion-gate slowdown and pause: `Cameras.govern` (a camera with a motion gate is
  slowed where nothing moves before its FPS is capped: energy before detections);
- lighter artifact: `Cameras.use_lighter` (re-activates the version; a failure is logged and
  the running model kept);
- stop (battery CRITICAL): `Cameras.halt`, then `on_stop` (the daemon publishes its status at
  once: the final status before the battery runs out); inference starts again when the level
  no longer asks for a stop.

Every transition is logged and published as a `GovernorEvent`. Threads: `step` runs in the
daemon's sampler thread (`agent.daemon.sampler`); `state` may be read from any thread (one
reference).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from agent.config.models import GovernorSection
from agent.errors import BundleError
from agent.event_values import GovernorEvent
from agent.governor.levels import Actions, Decision
from agent.governor.policy import Governor
from agent.hardware.fan import FanControl, FanError, open_fan
from agent.hardware.readings import SensorReadings
from agent.hardware.sysfs import SysFS
from agent.serving.cameras import Cameras
from agent.snapshot import GovernorState

log = logging.getLogger(__name__)


class Governing:
    """Steps the governor and applies its decisions to `cameras` and `fan` (None: no fan).
    `publish_event` sends a transition to the events topic; `on_stop` runs after inference was
    stopped. `monotonic` drives the governor's dwell; `wall` dates the state for telemetry."""

    def __init__(
        self,
        section: GovernorSection,
        cameras: Cameras,
        fan: FanControl | None,
        publish_event: Callable[[GovernorEvent], None],
        on_stop: Callable[[], None],
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.governor = Governor(section)
        self.cameras, self.fan = cameras, fan
        self._publish_event, self._on_stop = publish_event, on_stop
        self._monotonic, self._wall = monotonic, wall
        self._fan_set: float | None = None
        self._fan_error: str | None = None
        self.state: GovernorState | None = None

    @classmethod
    def with_fan(
        cls,
        section: GovernorSection,
        cameras: Cameras,
        fs: SysFS,
        pin_factory: Any,
        publish_event: Callable[[GovernorEvent], None],
        on_stop: Callable[[], None],
    ) -> Governing:
        """The governor with the fan `section` names, opened on `fs` (gpiozero's `pin_factory`
        for a GPIO fan, None: its default); a fan that cannot be opened is logged and left out."""
        try:
            fan = open_fan(section.fan, fs, pin_factory)
        except FanError as exc:
            log.error("governor: no fan: %s", exc)
            fan = None
        return cls(section, cameras, fan, publish_event, on_stop)

    def step(self, readings: SensorReadings) -> Decision:
        now = self._monotonic()
        previous = self.governor.last
        decision = self.governor.step(readings, now)
        if decision.changed:
            was = previous.level if previous else None
            log.warning("governor: %s -> %s: %s", was or "start", decision.level, decision.reason)
            self._publish_event(
                GovernorEvent(
                    ts=self._wall(),
                    level=decision.level,
                    previous=was,
                    thermal=decision.thermal,
                    battery=decision.battery,
                    reason=decision.reason,
                    temp_c=decision.temp_c,
                    battery_percent=decision.battery_percent,
                )
            )
        self._apply(decision.actions)
        since_ts = self._wall() - (now - decision.since)
        self.state = GovernorState(decision, since_ts, self._fan_set, self._fan_error)
        return decision

    def _apply(self, actions: Actions) -> None:
        if self.fan is not None and actions.fan_percent is not None and actions.fan_percent != self._fan_set:
            try:
                self.fan.set(actions.fan_percent)
                self._fan_set, self._fan_error = actions.fan_percent, None
            except FanError as exc:
                if str(exc) != self._fan_error:
                    log.error("governor: fan %s: %s", self.fan.name, exc)
                self._fan_error = str(exc)
        self.cameras.govern(actions.fps_cap, actions.paused, actions.gated_fps_cap, actions.gate_slowdown)
        try:
            if self.cameras.use_lighter(actions.artifact == "lighter"):
                log.info("governor: serving the %s artifact", actions.artifact)
        except BundleError as exc:
            log.error("governor: cannot switch to the %s artifact, keeping the running one: %s", actions.artifact, exc)
        if actions.stopped and not self.cameras.halted:
            log.warning("governor: stopping inference (%s)", self.governor.last.reason if self.governor.last else "")
            self.cameras.halt()
            self._on_stop()
        elif not actions.stopped and self.cameras.halted:
            log.warning("governor: starting inference again")
            try:
                self.cameras.resume()
            except BundleError as exc:
                log.error("governor: cannot start inference again: %s", exc)

    def close(self) -> None:
        if self.fan is not None:
            self.fan.close()
