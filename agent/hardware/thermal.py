"""Thermal zones: ``sys/class/thermal/thermal_zone*/{type,temp,trip_point_N_*}`` through `SysFS`.

Every Linux board has them (Jetson: ``cpu-thermal``, ``gpu-thermal``, ``tj-thermal``, ...;
Raspberry Pi: ``cpu-thermal``; x86: ``x86_pkg_temp``, ``acpitz``). ``temp`` and the trip
points' ``_temp`` / ``_hyst`` are in millidegrees Celsius. A zone that cannot be read, or reads
an impossible value (``N/A``, empty, -256000 as offline Orin zones do), has ``temp_c`` None:
unknown, never cool. Stateless; called from the sampler thread or the CLI.
"""

from __future__ import annotations

import re

from agent.hardware.readings import ThermalZone, TripPoint, plausible_c
from agent.hardware.sysfs import SysFS

ZONES = "sys/class/thermal/thermal_zone*"
#: zones whose value is not a temperature: the Jetson Nano's PMIC-Die reads a constant 100 °C
IGNORED_ZONES = frozenset({"PMIC-Die"})
_ZONE_NUMBER = re.compile(r"thermal_zone(\d+)$")


def _millidegrees(fs: SysFS, path: str) -> float | None:
    value = fs.read_number(path)
    return plausible_c(value / 1000.0) if value is not None else None


def _trips(fs: SysFS, zone: str) -> tuple[TripPoint, ...]:
    trips = []
    for path in fs.glob(f"{zone}/trip_point_*_temp"):
        stem = path[: -len("_temp")]
        temp_c = _millidegrees(fs, path)
        kind = fs.read_text(f"{stem}_type")
        if temp_c is None or not kind:
            continue
        hyst = fs.read_number(f"{stem}_hyst")
        hyst_c = hyst / 1000.0 if hyst is not None and 0 <= hyst <= 100_000 else 0.0
        trips.append(TripPoint(temp_c, kind, hyst_c))
    return tuple(sorted(trips, key=lambda t: t.temp_c))


def unique_names(names: list[str]) -> list[str]:
    """`names` with repeats made unique: the first keeps its name, later ones get ``_1``, ``_2``."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        unique.append(name if count == 0 else f"{name}_{count}")
    return unique


def read_thermal_zones(fs: SysFS) -> tuple[ThermalZone, ...]:
    """Every thermal zone in kernel order (``thermal_zone2`` before ``thermal_zone10``)."""
    found = []
    for path in fs.glob(ZONES):
        match = _ZONE_NUMBER.search(path)
        if match is None:
            continue
        kind = fs.read_text(f"{path}/type") or path.rsplit("/", 1)[1]
        if kind in IGNORED_ZONES:
            continue
        found.append((int(match.group(1)), kind, path))
    found.sort()
    names = unique_names([kind for _, kind, _ in found])
    return tuple(
        ThermalZone(name, _millidegrees(fs, f"{path}/temp"), _trips(fs, path))
        for name, (_, _, path) in zip(names, found, strict=True)
    )
