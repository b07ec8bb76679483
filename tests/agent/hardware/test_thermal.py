"""`agent.hardware.thermal`: zones that hold garbage or vanish read unknown; repeated types get numbered names."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from testkit import FAKES

from agent.hardware.readings import Rail, ThermalZone, TripPoint
from agent.hardware.sensors import Sensors


def copy_tree(tmp_path: Path, tree: str) -> Path:
    return Path(shutil.copytree(FAKES / tree, tmp_path / tree, symlinks=True))


@pytest.mark.parametrize(
    ("content", "expected"),
    [("N/A\n", None), ("", None), ("-256000\n", None), ("nan\n", None), ("999999999\n", None), ("-5000\n", -5.0)],
)
def test_garbage_in_a_zone_reads_unknown_never_cool(tmp_path: Path, content: str, expected: float | None) -> None:
    root = copy_tree(tmp_path, "rpi4")
    (root / "sys/class/thermal/thermal_zone0/temp").write_text(content)
    readings = Sensors(root, runner=None).read()
    assert readings.thermal_zones == (ThermalZone("cpu-thermal", expected, (TripPoint(110.0, "critical"),)),)
    assert readings.temp_c == expected


def test_a_vanishing_sensor_becomes_unknown(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, "jetson-orin-nano")
    sensors = Sensors(root)
    assert sensors.read().power_w == 5.802
    hwmon = root / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
    (hwmon / "curr1_input").write_text("N/A\n")
    (root / "sys/class/devfreq/17000000.gpu/device/load").write_text("-3\n")
    readings = sensors.read()
    assert readings.power_w is None and readings.power_source is None
    assert readings.rails[0] == Rail("VDD_IN", 5.072, None, None)  # the rail is there, its current unknown
    assert readings.gpu is not None and readings.gpu.load_percent is None
    for zone in (root / "sys/class/thermal").iterdir():
        shutil.rmtree(zone)
    shutil.rmtree(hwmon)
    readings = sensors.read()
    assert readings.temp_c is None and readings.thermal_zones == () and readings.rails == ()


def test_repeated_zone_types_get_numbered_names(tmp_path: Path) -> None:
    """Zones 0, 2 and 10 in kernel (number) order: by path string thermal_zone10 would come before
    thermal_zone2 and the names would move to other sensors."""
    for n in range(3):
        zone = tmp_path / f"sys/class/thermal/thermal_zone{(0, 2, 10)[n]}"
        zone.mkdir(parents=True)
        (zone / "type").write_text("acpitz\n")
        (zone / "temp").write_text(f"{40000 + n * 1000}\n")
    readings = Sensors(tmp_path, runner=None).read()
    assert readings.to_json()["thermal_zones"] == {"acpitz": 40.0, "acpitz_1": 41.0, "acpitz_2": 42.0}
