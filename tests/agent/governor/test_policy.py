"""`agent.governor.policy`: the pure governor through every level and back, hysteresis, dwell, vanished
sensors, battery levels, thresholds from config or trip points."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
from testkit import FAKES

from agent.config.models import GovernorSection, ThermalGovernorSection
from agent.governor.levels import Actions
from agent.governor.policy import Governor, decide, resolve_thresholds
from agent.hardware.readings import Battery, SensorReadings, ThermalZone
from agent.hardware.sensors import Sensors


def section(**thermal: Any) -> GovernorSection:
    settings = {"warm_c": 60, "hot_c": 70, "critical_c": 80, "hysteresis_c": 3, "min_dwell_s": 10, **thermal}
    return GovernorSection.model_validate({"thermal": settings, "battery": {"min_dwell_s": 10}})


def reading(temp_c: float | None = None, percent: float | None = None, status: str = "Discharging") -> SensorReadings:
    battery = Battery(percent, status, None, None, None, "test") if percent is not None else None
    return SensorReadings(thermal_zones=(ThermalZone("cpu-thermal", temp_c),), battery=battery)


def run(governor: Governor, steps: list[tuple[float, SensorReadings]]) -> list[str]:
    return [governor.step(readings, now).level for now, readings in steps]


RAMP = [
    # (now s, temp °C, level): up at once, down after hysteresis (3 °C) and dwell (10 s)
    (0, 50.0, "NORMAL"),
    (1, 62.0, "WARM"),
    (2, 71.0, "HOT"),
    (3, 81.0, "CRITICAL"),
    (4, 78.0, "CRITICAL"),  # under 80 but not 3 °C under
    (5, 76.0, "CRITICAL"),  # 3 °C under, but only 2 s in CRITICAL
    (13, 76.0, "HOT"),  # dwell done: 76 + 3 is in HOT
    (14, 55.0, "HOT"),  # dwell again, from 13
    (23, 55.0, "NORMAL"),  # 55 + 3 is under WARM too: straight to NORMAL
    (24, 95.0, "CRITICAL"),  # up is never delayed by the dwell
]


def test_ramp_up_and_down_through_every_level() -> None:
    governor = Governor(section())
    assert run(governor, [(now, reading(temp)) for now, temp, _ in RAMP]) == [level for _, _, level in RAMP]


def test_a_reading_sitting_on_a_threshold_does_not_make_the_level_flap() -> None:
    governor = Governor(section(min_dwell_s=0))
    levels = run(governor, [(float(i), reading(69.9 if i % 2 else 70.1)) for i in range(200)])
    assert levels == ["HOT"] * 200
    changes = [d for d in (governor.step(reading(t), 300.0 + i) for i, t in enumerate([69.0, 67.1, 66.9])) if d.changed]
    assert [(d.level, d.since) for d in changes] == [("WARM", 302.0)]


@pytest.mark.parametrize(("wait", "expected"), [(9.99, "HOT"), (10.0, "NORMAL")])
def test_the_minimum_dwell_is_respected(wait: float, expected: str) -> None:
    governor = Governor(section())
    governor.step(reading(75.0), 100.0)
    decision = governor.step(reading(40.0), 100.0 + wait)
    assert decision.level == expected
    if expected == "HOT":
        assert "minimum dwell" in decision.reason


def test_vanished_sensors_hold_the_level_and_say_so() -> None:
    governor = Governor(section())
    governor.step(reading(72.0), 0.0)
    for now in (20.0, 40.0):
        decision = governor.step(SensorReadings(), now)  # every zone gone
        assert (decision.level, decision.since, decision.temp_c) == ("HOT", 0.0, None)
        assert decision.reason == (
            "no temperature can be read: holding HOT; motion-gated cameras: idle interval and keepalive period x4"
        )
        assert decision.actions.fps_cap == 5.0
    unknown = SensorReadings(thermal_zones=(ThermalZone("cpu-thermal", None), ThermalZone("gpu-thermal", None)))
    assert governor.step(unknown, 50.0).level == "HOT"
    assert governor.step(reading(50.0), 60.0).level == "NORMAL"  # back, well below, dwell long over


@pytest.mark.parametrize("garbage", ["N/A\n", "", "-256000\n", "-1e12\n", "abc"])
def test_garbage_in_the_files_is_unknown_to_the_governor(tmp_path: Path, garbage: str) -> None:
    root = Path(shutil.copytree(FAKES / "laptop-battery", tmp_path / "tree"))
    governor = Governor(section())
    sensors = Sensors(root, runner=None)
    (root / "sys/class/thermal/thermal_zone1/temp").write_text("73000\n")
    (root / "sys/class/power_supply/BAT0/capacity").write_text("15\n")
    first = governor.step(sensors.read(), 0.0)
    assert (first.thermal, first.battery) == ("HOT", "LOW")
    for zone in ("thermal_zone0", "thermal_zone1"):
        (root / f"sys/class/thermal/{zone}/temp").write_text(garbage)
    (root / "sys/class/power_supply/BAT0/capacity").write_text(garbage)
    decision = governor.step(sensors.read(), 100.0)
    assert (decision.thermal, decision.battery, decision.temp_c, decision.battery_percent) == ("HOT", "LOW", None, None)
    assert "holding HOT" in decision.reason and "battery charge cannot be read: holding LOW" in decision.reason


BATTERY_DRAIN = [
    (0, 80.0, "Discharging", "OK", False),
    (60, 50.0, "Discharging", "OK", False),
    (120, 20.0, "Discharging", "LOW", False),
    (180, 10.0, "Discharging", "LOW", False),
    (240, 5.0, "Discharging", "CRITICAL", True),
    (300, 2.0, "Discharging", "CRITICAL", True),
    (360, 8.0, "Charging", "CRITICAL", True),  # not above 5 + 3 yet
    (420, 9.0, "Charging", "LOW", False),
    (425, 30.0, "Charging", "LOW", False),  # dwell: 5 s in LOW
    (480, 30.0, "Charging", "OK", False),
]


def test_battery_drain_stops_inference_at_critical_and_recovers() -> None:
    governor = Governor(section())
    for now, percent, status, level, stopped in BATTERY_DRAIN:
        decision = governor.step(reading(40.0, percent, status), float(now))
        assert (decision.battery, decision.actions.stopped) == (level, stopped), (now, percent)
        assert decision.level == ("NORMAL" if level == "OK" else level)


def test_no_battery_is_ok_and_a_vanished_battery_holds() -> None:
    governor = Governor(section())
    assert governor.step(reading(40.0), 0.0).reason == "40.0 °C: NORMAL"
    governor.step(reading(40.0, 4.0), 1.0)
    decision = governor.step(reading(40.0), 200.0)
    assert (decision.level, decision.actions.stopped) == ("CRITICAL", True)
    assert decision.reason == "battery charge cannot be read: holding CRITICAL"


def test_actions_of_both_axes_are_merged() -> None:
    decision = Governor(section()).step(reading(72.0, 15.0), 0.0)
    assert decision.level == "HOT" and decision.battery == "LOW"
    assert decision.actions == Actions(
        fps_cap=2.0, paused=False, fan_percent=100.0, artifact="lighter", gate_slowdown=4.0, gated_fps_cap=None
    )
    assert "battery 15 % at or below 20 %: LOW" in decision.reason
    assert Governor(section()).step(reading(30.0), 0.0).actions == Actions(fan_percent=0.0)
    critical = Governor(section()).step(reading(85.0), 0.0).actions
    assert (critical.paused, critical.fan_percent) == (True, 100.0)


@pytest.mark.parametrize(
    ("readings", "level", "battery"),
    [(lambda t: reading(t), "HOT", "OK"), (lambda t: reading(40.0, 100.0 - t), "LOW", "LOW")],
    ids=["thermal", "battery"],
)
def test_a_new_level_starts_its_own_dwell(readings: Any, level: str, battery: str) -> None:
    """Going up restarts the clock of the minimum dwell: after 100 s in WARM (battery: after 100 s
    OK), HOT (LOW) is reached at 100 s and held until 110 s, whatever came before."""
    governor = Governor(section())
    governor.step(readings(62.0), 0.0)  # WARM (the battery: 38 %, OK)
    up = governor.step(readings(72.0 if level == "HOT" else 85.0), 100.0)  # HOT (the battery: 15 %, LOW)
    assert (up.level, up.battery, up.since, up.changed) == (level, battery, 100.0, True)
    held = governor.step(readings(40.0 if level == "HOT" else 50.0), 105.0)  # cool again (battery: 50 %)
    assert held.level == level and "minimum dwell (5 s left)" in held.reason, held.reason
    assert governor.step(readings(40.0 if level == "HOT" else 50.0), 110.0).level == "NORMAL"


def test_step_is_pure() -> None:
    """`decide` depends on its arguments only: the same arguments give the same decision after
    other calls in between (no hidden state), and the previous decision it is given is left as
    it was (a frozen value, compared with a copy)."""
    first = decide(section(), None, reading(65.0), 5.0)
    assert (first.level, first.since, first.changed) == ("WARM", 5.0, True)
    kept = copy.deepcopy(first)
    later = decide(section(), first, reading(50.0), 6.0)
    assert (later.level, later.since) == ("WARM", 5.0) and "minimum dwell" in later.reason
    for now, temp in ((7.0, 90.0), (8.0, 40.0), (60.0, 40.0)):  # other steps, other levels, in between
        decide(section(), decide(section(), None, reading(temp), now), reading(temp), now + 1)
    assert decide(section(), first, reading(50.0), 6.0) == later
    assert decide(section(), None, reading(65.0), 5.0) == first
    assert first == kept, "the previous decision is not changed"
    assert not decide(section(), first, reading(66.0), 7.0).changed


def orin() -> SensorReadings:
    return Sensors(FAKES / "jetson-orin-nano", runner=None).read()


@pytest.mark.parametrize(
    ("tree", "config", "expected"),
    [
        ("jetson-orin-nano", {}, (84.0, 94.0, 99.5, ("trip points",) * 3)),
        ("jetson-nano", {}, (82.0, 92.0, 97.0, ("trip points",) * 3)),
        ("rpi4", {}, (65.0, 75.0, 85.0, ("default", "default", "trip points"))),  # capped at HOT + 10
        ("x86-generic", {}, (65.0, 75.0, 85.0, ("default",) * 3)),
        ("jetson-orin-nano", {"hot_c": 80}, (70.0, 80.0, 90.0, ("default", "config", "trip points"))),
        ("jetson-orin-nano", {"critical_c": 80}, (70.0, 75.0, 80.0, ("trip points", "trip points", "config"))),
        ("x86-generic", {"warm_c": 50, "hot_c": 60, "critical_c": 70}, (50.0, 60.0, 70.0, ("config",) * 3)),
        ("x86-generic", {"warm_c": 80}, (80.0, 85.0, 85.0 + 10, ("config", "default", "default"))),
    ],
)
def test_thresholds_from_config_else_trip_points(
    tree: str, config: dict[str, float], expected: tuple[Any, ...]
) -> None:
    readings = Sensors(FAKES / tree, runner=None).read()
    t = resolve_thresholds(ThermalGovernorSection.model_validate(config), readings)
    assert (t.warm_c, t.hot_c, t.critical_c, t.sources) == expected


def test_trip_points_drive_the_levels_when_nothing_is_configured() -> None:
    governor = Governor(GovernorSection())
    decision = governor.step(orin(), 0.0)
    assert decision.thresholds is not None and decision.thresholds.hot_c == 94.0
    assert decision.level == "NORMAL" and decision.temp_c == 48.5


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"thermal": {"warm_c": 70, "hot_c": 60}}, "warm_c (70.0) must be below hot_c (60.0)"),
        ({"battery": {"low_pct": 5, "critical_pct": 10}}, "critical_pct (10.0) must be below low_pct (5.0)"),
        ({"fan": {"kind": "gpio"}}, "a gpio fan needs its pin"),
        ({"actions": {"hot": {"fps_cap": 0}}}, "greater than 0"),
        ({"thermal": {"hot": 70}}, "Extra inputs are not permitted"),
        ({"actions": {"warm": {"gate_slowdown": 0.5}}}, "greater than or equal to 1"),
        ({"actions": {"warm": {"gate_slowdown": 11}}}, "less than or equal to 10"),
        ({"actions": {"hot": {"gated_fps_cap": 0}}}, "greater than 0"),
    ],
)
def test_bad_governor_config_names_the_problem(config: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        GovernorSection.model_validate(config)


# (temp °C, level, gate slowdown, FPS cap without a gate, FPS cap with one, paused): the defaults
ENERGY_ORDER = [
    (50.0, "NORMAL", 1.0, None, None, False),
    (62.0, "WARM", 2.0, None, None, False),  # still frames skipped longer: nothing capped yet
    (71.0, "HOT", 4.0, 5.0, None, False),  # cameras without a gate capped, as before; gated ones not
    (81.0, "CRITICAL", 1.0, None, None, True),  # everything paused
]


def test_heat_slows_the_motion_gates_before_it_caps_a_gated_cameras_fps() -> None:
    governor = Governor(section(min_dwell_s=0))
    seen = []
    for temp, *_ in ENERGY_ORDER:
        d = governor.step(reading(temp), 0.0)
        seen.append(
            (temp, d.level, d.actions.gate_slowdown, d.actions.fps_cap, d.actions.gated_fps_cap, d.actions.paused)
        )
    assert seen == ENERGY_ORDER
    warm = decide(section(), None, reading(62.0), 0.0)
    assert warm.reason == "62.0 °C reached WARM at 60.0 °C; motion-gated cameras: idle interval and keepalive period x2"
    cooled = governor.step(reading(40.0), 100.0)
    assert (cooled.level, cooled.actions.gate_slowdown, cooled.reason) == (
        "NORMAL",
        1.0,
        "40.0 °C fell below 77.0 °C: NORMAL",
    )


def test_the_longer_gate_slowdown_and_the_lower_gated_cap_of_both_axes_win() -> None:
    config = section().model_dump()
    config["actions"]["warm"].update(gate_slowdown=2, gated_fps_cap=8)
    config["actions"]["battery_low"].update(gate_slowdown=3, gated_fps_cap=10)
    decision = Governor(GovernorSection.model_validate(config)).step(reading(62.0, 15.0), 0.0)
    assert (decision.thermal, decision.battery) == ("WARM", "LOW")
    assert (decision.actions.gate_slowdown, decision.actions.gated_fps_cap) == (3.0, 8.0)
    assert decision.reason.endswith("; motion-gated cameras: idle interval and keepalive period x3, FPS capped at 8")
