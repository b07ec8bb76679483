"""`agent.daemon.sampler`: a fake board's readings at start and on every tick, the governor stepped
with them, the input power integrated into energy, and the thread's turns and its end as `Health`
sees them (an injected clock)."""

from __future__ import annotations

import errno
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from testkit import FAKES
from testkit.control import Clock
from testkit.net import wait_until

from agent.config.models import GovernorSection, SensorsSection
from agent.daemon.governing import Governing
from agent.daemon.sampler import Sampler
from agent.event_values import GovernorEvent
from agent.hardware.board import probe
from agent.hardware.sensors import Sensors
from agent.hardware.system import SystemMonitor
from agent.serving.cameras import Cameras
from agent.snapshot import judge_health
from pipelines.backoff import Backoff


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FAKES / "laptop-battery", tmp_path / "laptop-battery"))


def sampler_of(
    tree: Path,
    after: object,
    clock: Clock,
    interval_s: float = 0.05,
    governing: Governing | None = None,
    backoff: Backoff | None = None,
) -> Sampler:
    sensors = Sensors.from_config(SensorsSection(vcgencmd=False), tree, probe(tree))
    return Sampler(interval_s, SystemMonitor(), sensors, governing, after, monotonic=clock, backoff=backoff)  # type: ignore[arg-type]


@pytest.fixture
def stopped() -> Iterator[list[Sampler]]:
    samplers: list[Sampler] = []
    yield samplers
    for sampler in samplers:
        sampler.stop()


def test_readings_at_start_and_on_every_tick_step_the_governor(tree: Path, stopped: list[Sampler]) -> None:
    events: list[GovernorEvent] = []
    board = probe(tree)
    section = GovernorSection.model_validate({"battery": {"low_pct": 20, "critical_pct": 5, "min_dwell_s": 0}})
    governing = Governing(section, Cameras([], board), None, events.append, lambda: None)
    ticks: list[float | None] = []

    def charge() -> None:
        battery = sampler.readings.battery if sampler.readings is not None else None
        ticks.append(battery.percent if battery is not None else None)

    sampler = sampler_of(tree, charge, Clock(), governing=governing)
    stopped.append(sampler)
    sampler.start()
    assert sampler.system is not None and sampler.readings is not None, "the first sample is taken at start"
    assert sampler.governor is not None and sampler.governor.decision.level == "NORMAL"
    (tree / "sys/class/power_supply/BAT0/capacity").write_text("15\n")
    wait_until(lambda: ticks and ticks[-1] == 15.0, 10, "a tick to read the new charge")
    wait_until(lambda: sampler.governor is not None and sampler.governor.decision.level == "LOW", 10, "LOW")
    assert [(e.previous, e.level, e.battery_percent) for e in events] == [("NORMAL", "LOW", 15.0)]


def test_a_sampler_past_its_turn_is_hung(tree: Path, stopped: list[Sampler]) -> None:
    clock = Clock(50.0)
    sampler = sampler_of(tree, lambda: None, clock, interval_s=3600)  # its thread waits: only the clock moves
    stopped.append(sampler)
    assert sampler.loop().stalled_s == 0.0 and sampler.loop().ended is None, "not started: nothing to judge"
    sampler.start()
    clock.now += 3600 + 5.0
    assert sampler.loop().stalled_s == 5.0 and judge_health((), None, (sampler.loop(),), 5.0).ok
    clock.now += 1.0
    assert judge_health((), None, (sampler.loop(),), 5.0).problems == (
        "the sampler (sensors, governor, telemetry) has not turned for 6 s",
    )


def test_a_failing_tick_costs_that_tick_not_the_sampler(
    tree: Path, stopped: list[Sampler], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tick that raises (the process out of file descriptors: /proc/meminfo cannot be opened)
    is counted and health says the sampler fails its ticks; the ticks go on after a backoff, and
    the first good one clears the problem. (The red team's idle connections ended the sampler's
    thread for good, and the governor and telemetry with it.)"""
    exhausted = threading.Event()
    exhausted.set()
    real = SystemMonitor.sample
    ticks: list[int] = []

    def sample(monitor: SystemMonitor) -> object:
        if exhausted.is_set():
            raise OSError(errno.EMFILE, "Too many open files", "/proc/meminfo")
        return real(monitor)

    sampler = sampler_of(tree, lambda: ticks.append(1), Clock(), backoff=Backoff(initial=0.01, maximum=0.02))
    stopped.append(sampler)
    monkeypatch.setattr(SystemMonitor, "sample", sample)
    sampler.start()  # its first sample fails too: logged, the thread starts all the same
    wait_until(lambda: sampler.loop().failures >= 3, 10, "the sampler to fail a few ticks")
    assert sampler.loop().ended is None
    assert (
        judge_health((), None, (sampler.loop(),), 60.0)
        .problems[0]
        .startswith("the sampler (sensors, governor, telemetry) fails its turns (")
    )
    assert (
        "[Errno 24] Too many open files: '/proc/meminfo'" in judge_health((), None, (sampler.loop(),), 60.0).problems[0]
    )
    assert ticks == [], "a failed tick publishes nothing"
    exhausted.clear()
    wait_until(lambda: ticks and sampler.loop().failing is None, 10, "a good tick")
    assert sampler.system is not None and judge_health((), None, (sampler.loop(),), 60.0).ok


def test_each_sample_adds_the_boards_input_power_to_its_energy(tree: Path) -> None:
    """The laptop's battery: power_now absent, so voltage_now (µV) x current_now (µA) in watts,
    integrated on the sampler's clock; a reading that fails is a gap, not a guess."""
    bat = tree / "sys/class/power_supply/BAT0"
    clock = Clock(100.0)
    sampler = sampler_of(tree, lambda: None, clock)  # sampled by hand: no thread
    try:
        assert sampler.energy.energy is None
        steps = [(12_000_000, 1_000_000, 0.0), (12_000_000, 1_000_000, 10.0), (12_000_000, 2_000_000, 20.0)]
        for volts_u, amps_u, at in steps:  # 12 W, 12 W, 24 W
            (bat / "voltage_now").write_text(f"{volts_u}\n")
            (bat / "current_now").write_text(f"{amps_u}\n")
            clock.now = 100.0 + at
            sampler.sample()
        assert sampler.readings is not None and sampler.readings.power_w == 24.0
        energy = sampler.energy.energy
        assert energy is not None and (energy.joules, energy.measured_s) == pytest.approx((120.0 + 180.0, 20.0))
        assert energy.wh_per_h == pytest.approx(15.0)  # 300 J over 20 s: 15 W, 15 Wh an hour

        (bat / "current_now").write_text("garbage\n")
        clock.now = 130.0
        sampler.sample()  # no power: the interval from 120 s is not counted
        (bat / "current_now").write_text("1000000\n")
        for at in (140.0, 150.0):
            clock.now = at
            sampler.sample()
        energy = sampler.energy.energy
        assert energy is not None and (energy.joules, energy.measured_s) == pytest.approx((300.0 + 120.0, 30.0))
    finally:
        sampler.stop()
