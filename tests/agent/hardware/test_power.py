"""`agent.hardware.power`: the INA3221 rails in both driver layouts, read from the fake Jetson
trees and from hand-built ones, and the board's input power taken from its input rail only."""

from __future__ import annotations

from pathlib import Path

from testkit import FAKES

from agent.hardware.power import INPUT_RAILS, input_power, read_ina3221_rails
from agent.hardware.readings import Rail
from agent.hardware.sysfs import SysFS


def test_the_hwmon_layout_of_jetpack_5_and_6() -> None:
    """Orin Nano: millivolts and milliamps; the "sum of shunt voltages" channel is no rail."""
    assert read_ina3221_rails(SysFS(FAKES / "jetson-orin-nano")) == (
        Rail("VDD_IN", 5.072, 1.144, round(5.072 * 1.144, 3)),
        Rail("VDD_CPU_GPU_CV", 5.064, 0.312, round(5.064 * 0.312, 3)),
        Rail("VDD_SOC", 5.064, 0.64, round(5.064 * 0.64, 3)),
    )


def test_the_iio_layout_of_jetpack_4() -> None:
    assert read_ina3221_rails(SysFS(FAKES / "jetson-nano")) == (
        Rail("POM_5V_IN", 5.0, 1.344, 6.72),
        Rail("POM_5V_GPU", 4.992, 0.08, 0.399),
        Rail("POM_5V_CPU", 4.984, 0.402, 2.003),
    )


def _write(root: Path, folder: str, files: dict[str, str]) -> None:
    (root / folder).mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / folder / name).write_text(f"{text}\n")


def test_the_driver_s_power_wins_and_unreadable_values_are_unknown(tmp_path: Path) -> None:
    iio = "sys/bus/i2c/drivers/ina3221x/1-0041/iio:device1"
    _write(tmp_path, iio, {"rail_name_0": "5V_IN", "in_voltage0_input": "5000", "in_current0_input": "1000"})
    _write(tmp_path, iio, {"in_power0_input": "4800"})  # the driver's own reading, not V * I
    _write(tmp_path, iio, {"rail_name_1": "VDD_GPU", "in_voltage1_input": "5000", "in_current1_input": "-3"})
    _write(tmp_path, iio, {"rail_name_x": "broken"})
    hwmon = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon4"
    _write(tmp_path, hwmon, {"in1_label": "VDD_IN", "curr1_input": "500"})  # no voltage
    assert read_ina3221_rails(SysFS(tmp_path)) == (
        Rail("VDD_IN", None, 0.5, None),
        Rail("5V_IN", 5.0, 1.0, 4.8),
        Rail("VDD_GPU", 5.0, None, None),
    )


def test_input_power_is_the_first_input_rail_that_has_a_power() -> None:
    assert INPUT_RAILS[0] == "VDD_IN"
    parts = (Rail("VDD_CPU_GPU_CV", 5.0, 1.0, 5.0), Rail("VDD_SOC", 5.0, 1.0, 5.0))
    assert input_power(parts) == (None, None), "the parts of the board are never added up"
    assert input_power((*parts, Rail("POM_5V_IN", 5.0, 1.2, 6.0))) == (6.0, "POM_5V_IN")
    both = (Rail("POM_5V_IN", 5.0, 1.2, 6.0), Rail("VDD_IN", 5.0, 1.0, 5.0))
    assert input_power(both) == (5.0, "VDD_IN"), "in INPUT_RAILS' order, not the rails'"
    assert input_power((Rail("VDD_IN", None, 1.0, None), Rail("5V_IN", 5.0, 1.0, 5.1))) == (5.1, "5V_IN")
