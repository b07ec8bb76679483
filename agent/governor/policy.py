"""The governor's policy: `decide(section, previous, readings, now) -> Decision`, pure, and
`Governor`, which keeps the previous decision so the daemon calls ``step(readings, now)``.

Temperature (the hottest known zone) sets a thermal level, battery charge a battery level:

- Going up is immediate (the board is protected first): the level becomes the highest whose
  threshold the reading has reached.
- Going down needs the reading to be `hysteresis` below the current level's threshold (so a
  reading sitting on a threshold never makes the level flap) and the level to have lasted
  `min_dwell_s`; it then drops to the level the reading (plus hysteresis) is in.
- An unknown reading (every zone gone, garbage, the battery gone) is never taken as cool or
  full: the level is held, and the reason says so.

Thresholds not set in agent.yaml come from the board's trip points (`resolve_thresholds`):
HOT 5 °C before the lowest passive trip (where the kernel starts throttling), CRITICAL 5 °C
before the lowest critical trip (where it powers off) but at most 10 °C above HOT, WARM 10 °C
below HOT; without trip points, 65 / 75 / 85 °C. The actions of the thermal and the battery level are merged: the
lower FPS caps, the longer motion-gate slowdown, the faster fan, either one's pause, lighter
artifact or stop. Energy before detections (docs/telemetry.md "The governor"): by default a
camera with a motion gate is first slowed where nothing moves (WARM x2, HOT and battery LOW
x4: a longer idle interval and keepalive period) and its FPS is not capped before CRITICAL
pauses it; a camera without one is capped at HOT as before. The reason names what the gates
are told (whether or not a camera here has a gate: the policy does not know the cameras).

No I/O, no clock of its own, no threads: `now` is the caller's (monotonic) time in seconds.
"""

from __future__ import annotations

from agent.config.models import GovernorSection, LevelActions, ThermalGovernorSection
from agent.governor.levels import (
    BATTERY_SEVERITY,
    THERMAL_SEVERITY,
    Actions,
    BatteryLevel,
    Decision,
    TemperatureThresholds,
    ThermalLevel,
    ThresholdSource,
)
from agent.hardware.readings import SensorReadings

TRIP_MARGIN_C = 5.0  # act this far before the kernel does
WARM_BELOW_HOT_C = 10.0
CRITICAL_ABOVE_HOT_C = 10.0  # a critical trip far above HOT (a Pi's 110 °C) still pauses by then
DEFAULTS_C = (65.0, 75.0, 85.0)  # warm, hot, critical without config or trip points
_THERMAL = (ThermalLevel.NORMAL, ThermalLevel.WARM, ThermalLevel.HOT, ThermalLevel.CRITICAL)


def _pick(configured: float | None, from_trips: float | None, default: float) -> tuple[float, ThresholdSource]:
    if configured is not None:
        return float(configured), "config"
    if from_trips is not None:
        return from_trips, "trip points"
    return default, "default"


def resolve_thresholds(section: ThermalGovernorSection, readings: SensorReadings) -> TemperatureThresholds:
    """The thresholds for this board: agent.yaml's where set, else from trip points, else the
    defaults; derived values move out of the way of configured ones to keep them increasing.
    Raises `ValueError` when they cannot be put in order."""
    passive, critical = readings.trips("passive"), readings.trips("critical")
    hot, hot_source = _pick(section.hot_c, passive[0] - TRIP_MARGIN_C if passive else None, DEFAULTS_C[1])
    from_trip = min(critical[0] - TRIP_MARGIN_C, hot + CRITICAL_ABOVE_HOT_C) if critical else None
    crit, crit_source = _pick(section.critical_c, from_trip, DEFAULTS_C[2])
    warm_from_hot = hot - WARM_BELOW_HOT_C
    warm, warm_source = _pick(section.warm_c, warm_from_hot if hot_source == "trip points" else None, warm_from_hot)
    if hot_source != "config" and hot <= warm:
        hot = warm + TRIP_MARGIN_C
    if crit_source != "config" and crit <= hot:
        crit = hot + CRITICAL_ABOVE_HOT_C
    if hot_source != "config" and hot >= crit:
        hot = crit - TRIP_MARGIN_C
    if warm_source != "config" and warm >= hot:
        warm = hot - TRIP_MARGIN_C
    return TemperatureThresholds(warm, hot, crit, section.hysteresis_c, (warm_source, hot_source, crit_source))


def _thermal_of(temp_c: float, thresholds: TemperatureThresholds) -> ThermalLevel:
    return max((lvl for lvl in _THERMAL if temp_c >= thresholds.start_of(lvl)), key=_THERMAL.index)


def _thermal(
    previous: ThermalLevel,
    since: float,
    temp_c: float | None,
    thresholds: TemperatureThresholds,
    dwell_s: float,
    now: float,
) -> tuple[ThermalLevel, float, str]:
    if temp_c is None:
        return previous, since, f"no temperature can be read: holding {previous}"
    reached = _thermal_of(temp_c, thresholds)
    if _THERMAL.index(reached) > _THERMAL.index(previous):
        return reached, now, f"{temp_c:.1f} °C reached {reached} at {thresholds.start_of(reached):.1f} °C"
    if reached == previous:
        return previous, since, f"{temp_c:.1f} °C: {previous}"
    target = min(_thermal_of(temp_c + thresholds.hysteresis_c, thresholds), previous, key=_THERMAL.index)
    start = thresholds.start_of(previous)
    if target == previous:
        below = start - thresholds.hysteresis_c
        return previous, since, f"{temp_c:.1f} °C: holding {previous} until below {below:.1f} °C"
    if now - since < dwell_s:
        left = dwell_s - (now - since)
        return previous, since, f"{temp_c:.1f} °C: holding {previous} for its minimum dwell ({left:.0f} s left)"
    return target, now, f"{temp_c:.1f} °C fell below {start - thresholds.hysteresis_c:.1f} °C: {target}"


def _battery_of(percent: float, low: float, critical: float) -> BatteryLevel:
    return BatteryLevel.CRITICAL if percent <= critical else BatteryLevel.LOW if percent <= low else BatteryLevel.OK


_BATTERY = (BatteryLevel.OK, BatteryLevel.LOW, BatteryLevel.CRITICAL)


def _battery(
    section: GovernorSection, previous: BatteryLevel, since: float, percent: float | None, now: float
) -> tuple[BatteryLevel, float, str]:
    settings = section.battery
    if percent is None:
        if previous == BatteryLevel.OK:
            return previous, since, "no battery"
        return previous, since, f"battery charge cannot be read: holding {previous}"
    reached = _battery_of(percent, settings.low_pct, settings.critical_pct)
    if _BATTERY.index(reached) > _BATTERY.index(previous):
        limit = settings.critical_pct if reached == BatteryLevel.CRITICAL else settings.low_pct
        return reached, now, f"battery {percent:.0f} % at or below {limit:.0f} %: {reached}"
    if reached == previous:
        return previous, since, f"battery {percent:.0f} %: {previous}"
    hyst = settings.hysteresis_pct
    target = min(_battery_of(percent - hyst, settings.low_pct, settings.critical_pct), previous, key=_BATTERY.index)
    limit = settings.critical_pct if previous == BatteryLevel.CRITICAL else settings.low_pct
    if target == previous:
        return previous, since, f"battery {percent:.0f} %: holding {previous} until above {limit + hyst:.0f} %"
    if now - since < settings.min_dwell_s:
        left = settings.min_dwell_s - (now - since)
        return previous, since, f"battery {percent:.0f} %: holding {previous} for its minimum dwell ({left:.0f} s left)"
    return target, now, f"battery {percent:.0f} % rose above {limit + hyst:.0f} %: {target}"


def _thermal_actions(section: GovernorSection, level: ThermalLevel) -> LevelActions:
    actions = section.actions
    return {
        ThermalLevel.NORMAL: actions.normal,
        ThermalLevel.WARM: actions.warm,
        ThermalLevel.HOT: actions.hot,
        ThermalLevel.CRITICAL: actions.critical,
    }[level]


def _battery_actions(section: GovernorSection, level: BatteryLevel) -> LevelActions | None:
    actions = section.actions
    return {
        BatteryLevel.OK: None,
        BatteryLevel.LOW: actions.battery_low,
        BatteryLevel.CRITICAL: actions.battery_critical,
    }[level]


def _lowest(values: list[float | None]) -> float | None:
    given = [v for v in values if v is not None]
    return min(given) if given else None


def merge_actions(*levels: LevelActions | None) -> Actions:
    """One set of actions for several levels: the lowest caps, the longest gate slowdown, the
    fastest fan, any pause, lighter artifact or stop."""
    given = [a for a in levels if a is not None]
    fans = [a.fan_percent for a in given if a.fan_percent is not None]
    return Actions(
        fps_cap=_lowest([a.fps_cap for a in given]),
        paused=any(a.pause for a in given),
        fan_percent=max(fans) if fans else None,
        artifact="lighter" if any(a.lighter_artifact for a in given) else "default",
        stopped=any(a.stop for a in given),
        gate_slowdown=max([a.gate_slowdown for a in given], default=1.0),
        gated_fps_cap=_lowest([a.gated_fps_cap for a in given]),
    )


def gate_clause(actions: Actions) -> str:
    """What the actions do to motion-gated cameras, in words for the decision's reason ("" when
    nothing: no slowdown and no cap)."""
    parts = []
    if actions.gate_slowdown > 1.0:
        parts.append(f"idle interval and keepalive period x{actions.gate_slowdown:g}")
    if actions.gated_fps_cap is not None:
        parts.append(f"FPS capped at {actions.gated_fps_cap:g}")
    return f"; motion-gated cameras: {', '.join(parts)}" if parts else ""


def decide(section: GovernorSection, previous: Decision | None, readings: SensorReadings, now: float) -> Decision:
    """The next decision from the previous one (None at start: NORMAL, no battery level) and
    this step's readings. Pure: the same arguments always give the same decision."""
    thermal0 = previous.thermal if previous else ThermalLevel.NORMAL
    battery0 = previous.battery if previous else BatteryLevel.OK
    t_since0 = previous.thermal_since if previous else now
    b_since0 = previous.battery_since if previous else now
    temp_c = readings.temp_c
    try:
        thresholds: TemperatureThresholds | None = resolve_thresholds(section.thermal, readings)
    except ValueError as exc:
        thresholds = None
        thermal, t_since, t_reason = thermal0, t_since0, f"thresholds cannot be ordered ({exc}): holding {thermal0}"
    if thresholds is not None:
        dwell = section.thermal.min_dwell_s
        thermal, t_since, t_reason = _thermal(thermal0, t_since0, temp_c, thresholds, dwell, now)
    percent = readings.battery.percent if readings.battery is not None else None
    battery, b_since, b_reason = _battery(section, battery0, b_since0, percent, now)
    battery_governs = BATTERY_SEVERITY[battery] > THERMAL_SEVERITY[thermal]
    level = battery if battery_governs else thermal
    reason = b_reason if battery_governs else t_reason
    if battery_governs and thermal != ThermalLevel.NORMAL:
        reason += f"; {t_reason}"
    elif not battery_governs and battery != BatteryLevel.OK:
        reason += f"; {b_reason}"
    actions = merge_actions(_thermal_actions(section, thermal), _battery_actions(section, battery))
    reason += gate_clause(actions)
    return Decision(
        level=level.value,
        thermal=thermal,
        battery=battery,
        reason=reason,
        since=b_since if battery_governs else t_since,
        thermal_since=t_since,
        battery_since=b_since,
        actions=actions,
        thresholds=thresholds,
        changed=thermal != thermal0 or battery != battery0,
        temp_c=temp_c,
        battery_percent=percent,
    )


class Governor:
    """`decide` with its memory: each `step` starts from the previous decision. One thread
    (the daemon's sampler) steps it; `last` may be read from any thread."""

    def __init__(self, section: GovernorSection) -> None:
        self.section = section
        self.last: Decision | None = None

    def step(self, readings: SensorReadings, now: float) -> Decision:
        self.last = decide(self.section, self.last, readings, now)
        return self.last
