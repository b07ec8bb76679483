"""`agent.hardware.thermal` read directly on a hand-built tree: kernel order, ignored and repeated
zones, trip points in millidegrees with their hysteresis."""

from __future__ import annotations

from pathlib import Path

from agent.hardware.readings import ThermalZone, TripPoint
from agent.hardware.sysfs import SysFS
from agent.hardware.thermal import read_thermal_zones, unique_names


def _zone(root: Path, number: int, files: dict[str, str]) -> None:
    folder = root / "sys/class/thermal" / f"thermal_zone{number}"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(f"{text}\n")


def test_zones_in_kernel_order_with_repeats_numbered_and_the_pmic_left_out(tmp_path: Path) -> None:
    _zone(tmp_path, 10, {"type": "cpu-thermal", "temp": "41500"})
    _zone(tmp_path, 2, {"type": "cpu-thermal", "temp": "40000"})
    _zone(tmp_path, 3, {"type": "PMIC-Die", "temp": "100000"})
    _zone(tmp_path, 4, {"temp": "-5000"})  # no type: the folder's name
    _zone(tmp_path, 5, {"type": "gpu-thermal", "temp": "-256000"})  # an offline Orin zone
    assert read_thermal_zones(SysFS(tmp_path)) == (
        ThermalZone("cpu-thermal", 40.0),
        ThermalZone("thermal_zone4", -5.0),
        ThermalZone("gpu-thermal", None),
        ThermalZone("cpu-thermal_1", 41.5),
    )


def test_trip_points_sorted_with_hysteresis_and_unreadable_ones_skipped(tmp_path: Path) -> None:
    _zone(
        tmp_path,
        0,
        {
            "type": "cpu-thermal",
            "temp": "55000",
            "trip_point_0_temp": "110000",
            "trip_point_0_type": "critical",
            "trip_point_1_temp": "85000",
            "trip_point_1_type": "passive",
            "trip_point_1_hyst": "2000",
            "trip_point_2_temp": "60000",
            "trip_point_2_type": "active",
            "trip_point_2_hyst": "200000",  # beyond 100 °C: not a hysteresis, read as none
            "trip_point_3_temp": "N/A",
            "trip_point_3_type": "hot",
            "trip_point_4_temp": "70000",  # no type
        },
    )
    (zone,) = read_thermal_zones(SysFS(tmp_path))
    assert zone.trips == (TripPoint(60.0, "active", 0.0), TripPoint(85.0, "passive", 2.0), TripPoint(110.0, "critical"))


def test_unique_names_number_the_later_repeats() -> None:
    assert unique_names(["a", "b", "a", "a", "b"]) == ["a", "b", "a_1", "a_2", "b_1"]
    assert unique_names([]) == []
