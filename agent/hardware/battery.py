"""Batteries: the kernel's ``power_supply`` class through `SysFS`, and an INA219 UPS HAT over I2C.

- ``sys/class/power_supply/<name>/`` with ``type`` = ``Battery`` (laptops, handhelds, UPS boards
  with a fuel-gauge driver): ``capacity`` (%), ``status`` (``Charging``, ``Discharging``,
  ``Full``, ``Not charging``, ``Unknown``), ``voltage_now`` (µV), ``current_now`` (µA),
  ``power_now`` (µW). Batteries of peripherals (``scope`` = ``Device``: a mouse) are skipped.
- An INA219 current monitor on I2C, as on the Waveshare UPS HATs (address 0x42, a 0.1 Ω shunt):
  bus voltage (register 2, 4 mV per bit above bit 3) and shunt voltage (register 1, signed,
  10 µV per bit) through smbus2; the charge is estimated from the pack voltage between
  `empty_v` and `full_v`. Positive current charges the pack. smbus2 is imported when the UPS is
  configured (the ``rpi`` extra); the bus comes from an injectable `bus_factory`.

Nothing here raises: an unreadable battery reads as None. Called from the sampler thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from agent.hardware.readings import Battery
from agent.hardware.sysfs import SysFS

log = logging.getLogger(__name__)

SUPPLIES = "sys/class/power_supply"


def _micro(fs: SysFS, path: str) -> float | None:
    value = fs.read_number(path)
    return value / 1e6 if value is not None else None


def _percent(value: float | None) -> float | None:
    return value if value is not None and 0 <= value <= 100 else None


def read_power_supply_battery(fs: SysFS) -> Battery | None:
    """The first system battery under ``sys/class/power_supply``, or None."""
    for name in fs.listdir(SUPPLIES):
        folder = f"{SUPPLIES}/{name}"
        if fs.read_text(f"{folder}/type") != "Battery" or fs.read_text(f"{folder}/scope") == "Device":
            continue
        voltage = _micro(fs, f"{folder}/voltage_now")
        current = _micro(fs, f"{folder}/current_now")
        power = _micro(fs, f"{folder}/power_now")
        if power is None and voltage is not None and current is not None:
            power = voltage * abs(current)
        return Battery(
            percent=_percent(fs.read_number(f"{folder}/capacity")),
            status=fs.read_text(f"{folder}/status") or None,
            voltage_v=None if voltage is None or voltage < 0 else round(voltage, 3),
            current_a=None if current is None else round(current, 3),
            power_w=None if power is None else round(abs(power), 3),
            source=f"power_supply/{name}",
        )
    return None


class SMBusLike(Protocol):
    """The part of ``smbus2.SMBus`` the UPS reader uses."""

    def read_word_data(self, i2c_addr: int, register: int) -> int: ...

    def close(self) -> None: ...


def _smbus(bus: int) -> SMBusLike:
    from smbus2 import SMBus

    return SMBus(bus)


def _swap(word: int) -> int:
    """SMBus reads words least significant byte first; the INA219 sends the MSB first."""
    return ((word & 0xFF) << 8) | (word >> 8)


class Ina219Ups:
    """A UPS HAT's INA219 at `address` on I2C bus `bus`."""

    def __init__(
        self,
        bus: int = 1,
        address: int = 0x42,
        shunt_ohms: float = 0.1,
        empty_v: float = 6.0,
        full_v: float = 8.4,
        bus_factory: Callable[[int], SMBusLike] = _smbus,
    ) -> None:
        self.bus, self.address, self.shunt_ohms = bus, address, shunt_ohms
        self.empty_v, self.full_v = empty_v, full_v
        self._bus_factory = bus_factory
        self._warned = False

    def read(self) -> Battery | None:
        try:
            smbus = self._bus_factory(self.bus)
            try:
                shunt_raw = _swap(smbus.read_word_data(self.address, 0x01))
                bus_raw = _swap(smbus.read_word_data(self.address, 0x02))
            finally:
                smbus.close()
        except (OSError, ImportError) as exc:
            if not self._warned:
                log.warning("UPS INA219 at bus %d address 0x%02x: %s", self.bus, self.address, exc)
                self._warned = True
            return None
        self._warned = False
        shunt_v = (shunt_raw - 0x10000 if shunt_raw & 0x8000 else shunt_raw) * 10e-6
        voltage = (bus_raw >> 3) * 0.004
        current = shunt_v / self.shunt_ohms
        fraction = (voltage - self.empty_v) / (self.full_v - self.empty_v)
        status = "Charging" if current > 0.02 else "Discharging" if current < -0.02 else "Not charging"
        return Battery(
            percent=round(min(max(fraction, 0.0), 1.0) * 100, 1),
            status=status,
            voltage_v=round(voltage, 3),
            current_a=round(current, 3),
            power_w=round(abs(voltage * current), 3),
            source=f"ina219/{self.bus}-{self.address:04x}",
        )
