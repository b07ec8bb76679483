"""`agent.hardware.raspberry`: vcgencmd's throttled bits, garbage, a missing binary, the Pi 5 PMIC rails."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from testkit import FAKES

from agent.hardware.raspberry import Vcgencmd, parse_pmic, parse_throttled, run_command
from agent.hardware.sensors import Sensors


def on_path(monkeypatch: pytest.MonkeyPatch, tree: Path) -> None:
    """The tree's fake ``vcgencmd`` first on PATH, as a technician would put another one."""
    monkeypatch.setenv("PATH", f"{tree / 'usr/bin'}{os.pathsep}{os.environ['PATH']}")


def test_pi5_power_is_the_sum_of_the_pmic_rails(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, FAKES / "rpi5")
    readings = Sensors(FAKES / "rpi5").read()
    assert len(readings.rails) == 12  # EXT5V_V and BATT_V have no current: not rails
    vdd_core = next(r for r in readings.rails if r.name == "VDD_CORE")
    assert (vdd_core.voltage_v, vdd_core.current_a, vdd_core.power_w) == (0.881, 0.7328, 0.6456)
    assert readings.power_w == pytest.approx(sum(r.power_w or 0 for r in readings.rails), abs=0.002)


@pytest.mark.parametrize(
    ("text", "flags"),
    [
        ("throttled=0x0\n", set()),
        ("throttled=0x50005\n", {"under_voltage", "throttled", "under_voltage_since_boot", "throttled_since_boot"}),
        ("throttled=0x80008", {"soft_temp_limit", "soft_temp_limit_since_boot"}),
        ("throttled=0x20002", {"arm_frequency_capped", "arm_frequency_capped_since_boot"}),
    ],
)
def test_get_throttled_bits(text: str, flags: set[str]) -> None:
    throttled = parse_throttled(text)
    assert throttled is not None
    assert {name for name, value in vars(throttled).items() if value is True} == flags
    assert throttled.any_now == bool({"under_voltage", "arm_frequency_capped", "throttled", "soft_temp_limit"} & flags)


@pytest.mark.parametrize("text", [None, "", 'error=2 error_msg="Command not registered"', "throttled=zz"])
def test_vcgencmd_garbage_reads_unknown(text: str | None) -> None:
    vcgencmd = Vcgencmd(lambda argv: text)
    assert vcgencmd.throttled() is None and vcgencmd.temp_c() is None and vcgencmd.pmic_rails() == ()
    assert parse_pmic("VDD_CORE_A current(7)=0.5A\nVDD_CORE_V volt(15)=nanV\n") == ()


def test_the_runner_finds_vcgencmd_on_path_and_reports_a_missing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, FAKES / "rpi4")
    assert run_command(["vcgencmd", "get_throttled"]) == "throttled=0x50005\n"
    assert run_command(["vcgencmd", "pmic_read_adc"]) is None  # exit 255 on a Pi 4
    monkeypatch.setenv("EDGE_AGENT_FAKE_THROTTLED", "0x4")
    assert run_command(["vcgencmd", "get_throttled"]) == "throttled=0x4\n"
    monkeypatch.setenv("PATH", str(FAKES / "x86-generic"))  # no vcgencmd anywhere on it
    assert run_command(["vcgencmd", "get_throttled"]) is None


def test_a_pi4_stops_asking_for_the_pmic_after_it_said_no() -> None:
    calls: list[str] = []

    def runner(argv: Any) -> str | None:
        calls.append(argv[1])
        return {"get_throttled": "throttled=0x0", "measure_temp": "temp=50.0'C"}.get(argv[1])

    sensors = Sensors(FAKES / "x86-generic", runner=runner)
    sensors.read()
    sensors.read()
    assert calls == ["get_throttled", "measure_temp", "pmic_read_adc", "get_throttled", "measure_temp"]
