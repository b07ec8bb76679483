"""`agent.hardware.battery`: power_supply batteries (garbage, peripherals) and the INA219 UPS over I2C."""

from __future__ import annotations

import shutil
from pathlib import Path

from testkit import FAKES

from agent.hardware.battery import Ina219Ups, read_power_supply_battery
from agent.hardware.readings import Battery
from agent.hardware.sensors import Sensors
from agent.hardware.sysfs import SysFS


def copy_tree(tmp_path: Path, tree: str) -> Path:
    return Path(shutil.copytree(FAKES / tree, tmp_path / tree, symlinks=True))


def test_battery_garbage_and_peripheral_batteries(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, "laptop-battery")
    bat0 = root / "sys/class/power_supply/BAT0"
    (bat0 / "capacity").write_text("-5\n")
    (bat0 / "voltage_now").write_text("N/A\n")
    battery = read_power_supply_battery(SysFS(root))
    assert battery == Battery(None, "Discharging", None, 1.021, None, "power_supply/BAT0")
    shutil.rmtree(bat0)
    assert read_power_supply_battery(SysFS(root)) is None  # the mouse (scope Device) is not the board's


class FakeSMBus:
    """Test double of ``smbus2.SMBus`` (no I2C bus here): the INA219's registers as the bus
    returns them, least significant byte first."""

    def __init__(self, registers: dict[int, int]) -> None:
        self.registers, self.closed = registers, False

    def read_word_data(self, i2c_addr: int, register: int) -> int:
        if i2c_addr != 0x42:
            raise OSError(121, "Remote I/O error")
        value = self.registers[register]
        return ((value & 0xFF) << 8) | (value >> 8)

    def close(self) -> None:
        self.closed = True


def test_ina219_ups_reading() -> None:
    # bus 7.4 V (1850 << 3), shunt -0.05 V (-5000 x 10 µV): 0.5 A out of the pack
    bus = FakeSMBus({0x02: 1850 << 3, 0x01: 0x10000 - 5000})
    battery = Ina219Ups(bus_factory=lambda number: bus).read()
    assert battery == Battery(58.3, "Discharging", 7.4, -0.5, 3.7, "ina219/1-0042")
    assert bus.closed
    assert Ina219Ups(address=0x40, bus_factory=lambda number: bus).read() is None  # nothing answers there


def test_ups_feeds_the_battery_and_the_board_power(tmp_path: Path) -> None:
    bus = FakeSMBus({0x02: 1850 << 3, 0x01: 0x10000 - 5000})
    readings = Sensors(tmp_path, runner=None, ups=Ina219Ups(bus_factory=lambda n: bus)).read()
    assert readings.battery is not None and readings.battery.percent == 58.3
    assert (readings.power_w, readings.power_source) == (3.7, "battery")
