"""Jetson power rails: the INA3221 monitors through `SysFS`, in both layouts NVIDIA has used.

- JetPack 5 and 6 (mainline ``ina3221`` hwmon driver):
  ``sys/bus/i2c/drivers/ina3221/<bus>-<addr>/hwmon/hwmon<N>/in<C>_label`` (``VDD_IN``),
  ``in<C>_input`` (mV), ``curr<C>_input`` (mA). The hwmon number differs between boots and
  boards, so it is globbed.
- JetPack 4 (NVIDIA's ``ina3221x`` iio driver):
  ``sys/bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:device<N>/rail_name_<C>`` (``POM_5V_IN``),
  ``in_voltage<C>_input`` (mV), ``in_current<C>_input`` (mA), ``in_power<C>_input`` (mW).

The board's total is its input rail (`INPUT_RAILS`, the first present); the other rails are
parts of it (CPU+GPU+CV, SoC, ...) and are never added up, because their scopes overlap.
Stateless; channels that cannot be read are left out.
"""

from __future__ import annotations

import re

from agent.hardware.readings import Rail
from agent.hardware.sysfs import SysFS

#: the input rail, which measures the whole module, by name as each Jetson labels it:
#: Orin Nano / NX, TX2 and Xavier (``VDD_IN``), Nano on JetPack 4 (``POM_5V_IN``), Xavier NX
#: on older releases (``5V_IN``)
INPUT_RAILS = ("VDD_IN", "POM_5V_IN", "5V_IN")

HWMON_LABELS = "sys/bus/i2c/drivers/ina3221*/*/hwmon/hwmon*/in*_label"
IIO_NAMES = "sys/bus/i2c/drivers/ina3221x/*/iio:device*/rail_name_*"
_CHANNEL = re.compile(r"(\d+)(?:_label)?$")


def _milli(fs: SysFS, path: str) -> float | None:
    value = fs.read_number(path)
    return value / 1000.0 if value is not None and value >= 0 else None


def _rail(name: str, voltage_v: float | None, current_a: float | None, power_w: float | None = None) -> Rail:
    if power_w is None and voltage_v is not None and current_a is not None:
        power_w = voltage_v * current_a
    return Rail(
        name,
        None if voltage_v is None else round(voltage_v, 3),
        None if current_a is None else round(current_a, 3),
        None if power_w is None else round(power_w, 3),
    )


def _hwmon_rails(fs: SysFS) -> list[Rail]:
    rails = []
    for label_path in fs.glob(HWMON_LABELS):
        folder, label_file = label_path.rsplit("/", 1)
        match = _CHANNEL.search(label_file)
        name = fs.read_text(label_path)
        if match is None or not name or fs.read_text(f"{folder}/curr{match.group(1)}_input") is None:
            continue  # not a rail (the "sum of shunt voltages" channel has no current)
        channel = match.group(1)
        voltage, current = _milli(fs, f"{folder}/in{channel}_input"), _milli(fs, f"{folder}/curr{channel}_input")
        rails.append(_rail(name, voltage, current))
    return rails


def _iio_rails(fs: SysFS) -> list[Rail]:
    rails = []
    for name_path in fs.glob(IIO_NAMES):
        folder, name_file = name_path.rsplit("/", 1)
        channel = name_file.rsplit("_", 1)[1]
        name = fs.read_text(name_path)
        if not name or not channel.isdigit():
            continue
        rails.append(
            _rail(
                name,
                _milli(fs, f"{folder}/in_voltage{channel}_input"),
                _milli(fs, f"{folder}/in_current{channel}_input"),
                _milli(fs, f"{folder}/in_power{channel}_input"),
            )
        )
    return rails


def read_ina3221_rails(fs: SysFS) -> tuple[Rail, ...]:
    """Every INA3221 channel with a name, hwmon layout first, then iio."""
    return tuple(_hwmon_rails(fs) + _iio_rails(fs))


def input_power(rails: tuple[Rail, ...]) -> tuple[float | None, str | None]:
    """The board's input power in watts and the rail that measured it, or (None, None)."""
    by_name = {rail.name: rail for rail in rails}
    for name in INPUT_RAILS:
        rail = by_name.get(name)
        if rail is not None and rail.power_w is not None:
            return rail.power_w, name
    return None, None
