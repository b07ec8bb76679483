"""`agent.hardware.sensors`: every fake board's sensors end to end, and a captured tree as the board read it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from testkit import FAKES

from agent.cli import main
from agent.hardware.sensors import Sensors

NO_FLAGS = dict.fromkeys(
    [
        "under_voltage",
        "arm_frequency_capped",
        "throttled",
        "soft_temp_limit",
        "under_voltage_since_boot",
        "arm_frequency_capped_since_boot",
        "throttled_since_boot",
        "soft_temp_limit_since_boot",
    ],
    False,
)


GPU_NONE = {"temp_c": None, "memory_used_mb": None, "memory_total_mb": None, "power_w": None}


EXPECTED: dict[str, dict[str, Any]] = {
    "jetson-orin-nano": {
        "temp_c": 48.5,
        "thermal_zones": {
            "cpu-thermal": 47.5,
            "gpu-thermal": 46.812,
            "cv0-thermal": None,  # -256000: an offline zone, unknown
            "cv1-thermal": None,
            "cv2-thermal": None,
            "soc0-thermal": 45.968,
            "soc1-thermal": 47.062,
            "soc2-thermal": 45.343,
            "tj-thermal": 48.5,
        },
        "power_w": 5.802,  # VDD_IN: 5.072 V x 1.144 A
        "power_source": "VDD_IN",
        "rails": {
            "VDD_IN": {"voltage_v": 5.072, "current_a": 1.144, "power_w": 5.802},
            "VDD_CPU_GPU_CV": {"voltage_v": 5.064, "current_a": 0.312, "power_w": 1.58},
            "VDD_SOC": {"voltage_v": 5.064, "current_a": 0.64, "power_w": 3.241},
        },
        "battery": None,
        "throttled": None,
        "fan": {"duty_percent": 40.0, "rpm": 2316.0},  # pwm1 102 of 255
        "gpu": {"name": "17000000.gpu", "load_percent": 12.3, "freq_mhz": 306.0, **GPU_NONE},
        "sources": ["thermal", "ina3221", "fan", "devfreq"],
    },
    "jetson-nano": {
        "temp_c": 40.5,  # PMIC-Die's constant 100 °C is not a temperature
        "thermal_zones": {
            "AO-therm": 40.5,
            "CPU-therm": 38.0,
            "GPU-therm": 37.5,
            "PLL-therm": 36.0,
            "thermal-fan-est": 37.8,
        },
        "power_w": 6.72,
        "power_source": "POM_5V_IN",
        "rails": {
            "POM_5V_IN": {"voltage_v": 5.0, "current_a": 1.344, "power_w": 6.72},
            "POM_5V_GPU": {"voltage_v": 4.992, "current_a": 0.08, "power_w": 0.399},
            "POM_5V_CPU": {"voltage_v": 4.984, "current_a": 0.402, "power_w": 2.003},
        },
        "battery": None,
        "throttled": None,
        "fan": {"duty_percent": 30.2, "rpm": 1420.0},
        "gpu": {"name": "57000000.gpu", "load_percent": 3.4, "freq_mhz": 76.8, **GPU_NONE},
        "sources": ["thermal", "ina3221", "fan", "devfreq"],
    },
    "rpi4": {
        "temp_c": 52.6,
        "thermal_zones": {"cpu-thermal": 52.582, "vcgencmd": 52.6},
        "power_w": None,  # no PMIC ADC before the Pi 5
        "power_source": None,
        "rails": {},
        "battery": None,
        "throttled": {
            **NO_FLAGS,
            "under_voltage": True,
            "throttled": True,
            "under_voltage_since_boot": True,
            "throttled_since_boot": True,
        },
        "fan": None,
        "gpu": None,
        "sources": ["thermal", "vcgencmd"],
    },
    "rpi5": {
        "temp_c": 61.5,
        "thermal_zones": {"cpu-thermal": 61.45, "vcgencmd": 61.5},
        "power_w": 1.779,
        "power_source": "pmic",
        "battery": None,
        "throttled": NO_FLAGS,
        "fan": {"duty_percent": 29.4, "rpm": 2961.0},
        "gpu": None,
        "sources": ["thermal", "vcgencmd", "fan", "pmic"],
    },
    "laptop-battery": {
        "temp_c": 52.0,
        "thermal_zones": {"acpitz": 45.0, "x86_pkg_temp": 52.0, "iwlwifi_1": None},
        "power_w": 12.119,  # discharging: 11.87 V x 1.021 A
        "power_source": "battery",
        "rails": {},
        "battery": {
            "percent": 57.0,
            "status": "Discharging",
            "voltage_v": 11.87,
            "current_a": 1.021,
            "power_w": 12.119,
        },
        "throttled": None,
        "fan": None,
        "gpu": None,
        "sources": ["thermal", "power_supply"],
    },
    "x86-generic": {
        "temp_c": None,
        "thermal_zones": {},
        "power_w": None,
        "power_source": None,
        "rails": {},
        "battery": None,
        "throttled": None,
        "fan": None,
        "gpu": None,
        "sources": [],
    },
}


def on_path(monkeypatch: pytest.MonkeyPatch, tree: Path) -> None:
    """The tree's fake ``vcgencmd`` first on PATH, as a technician would put another one."""
    monkeypatch.setenv("PATH", f"{tree / 'usr/bin'}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("tree", sorted(EXPECTED))
def test_each_fake_board_reads_end_to_end(tree: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    on_path(monkeypatch, FAKES / tree)
    assert main(["telemetry", "--once", "--json", "--root", str(FAKES / tree)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) == {"board", "sensors"}
    sensors = document["sensors"]
    expected = EXPECTED[tree]
    assert {key: sensors[key] for key in expected} == expected
    assert set(sensors) >= {"temp_c", "thermal_zones", "power_w", "rails", "battery", "throttled", "fan", "gpu"}


@pytest.mark.parametrize("tree", ["jetson-orin-nano", "jetson-nano", "laptop-battery"])
def test_a_captured_tree_reads_as_the_board_did(tree: str, tmp_path: Path) -> None:
    """scripts/capture_board.sh copies what the sensors read, values only."""
    import subprocess

    from testkit import REPO

    env = {**os.environ, "CAPTURE_ROOT": str(FAKES / tree)}
    subprocess.run([str(REPO / "scripts/capture_board.sh"), str(tmp_path / "captured")], env=env, check=True)
    assert Sensors(tmp_path / "captured", runner=None).read() == Sensors(FAKES / tree, runner=None).read()
    assert not (tmp_path / "captured/sys/class/power_supply/BAT0/model_name").exists()
