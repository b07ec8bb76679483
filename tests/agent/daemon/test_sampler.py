"""`agent.daemon.sampler`: a fake board's readings at start and on every tick, the governor stepped
with them, and the thread's turns and its end as `Health` sees them (an injected clock)."""

from __future__ import annotations

import shutil
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


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FAKES / "laptop-battery", tmp_path / "laptop-battery"))


def sampler_of(
    tree: Path, after: object, clock: Clock, interval_s: float = 0.05, governing: Governing | None = None
) -> Sampler:
    sensors = Sensors.from_config(SensorsSection(vcgencmd=False), tree, probe(tree))
    return Sampler(interval_s, SystemMonitor(), sensors, governing, after, monotonic=clock)  # type: ignore[arg-type]


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


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the thread's end is the point
def test_a_sampler_whose_thread_ended_is_a_problem_at_once(tree: Path, stopped: list[Sampler]) -> None:
    def after() -> None:
        raise RuntimeError("telemetry could not be made")

    sampler = sampler_of(tree, after, Clock())
    stopped.append(sampler)
    sampler.start()
    wait_until(lambda: sampler.loop().ended is not None, 10, "the sampler to end")
    assert judge_health((), None, (sampler.loop(),), 60.0).problems == (
        "the sampler (sensors, governor, telemetry) is not running: RuntimeError: telemetry could not be made",
    )
