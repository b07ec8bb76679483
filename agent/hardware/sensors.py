"""All sensors of a board as one reading set: `Sensors(root).read() -> SensorReadings`.

Each source is optional and read through a seam: files through `SysFS(root)` (thermal zones,
INA3221 rails, the fan, devfreq, ``power_supply``), ``vcgencmd`` through a command runner,
the UPS through an I2C bus factory, jtop and NVML through their adapters. A source that is
absent, unreadable or garbled contributes nothing; `read` never raises.

Precedence where two sources measure the same thing: the board's input power comes from the
INA3221 input rail, else jtop's total, else the Pi 5 PMIC estimate, else a discharging
battery; the GPU from Jetson devfreq, else jtop, else NVML; the fan from sysfs, else jtop;
the battery from ``power_supply``, else the UPS. jtop's temperatures are used only when no
sysfs zone can be read (its service runs as root, the agent may not).

Threads: `read` is called from one thread at a time (the daemon's sampler, or the CLI);
`close` releases jtop and NVML.
"""

from __future__ import annotations

from pathlib import Path

from agent.config.models import SensorsSection
from agent.hardware.battery import Ina219Ups, read_power_supply_battery
from agent.hardware.board import Board, probe
from agent.hardware.jetson import JtopSource, read_fan, read_gpu_load
from agent.hardware.nvidia import NvmlGpu
from agent.hardware.power import input_power, read_ina3221_rails
from agent.hardware.raspberry import CommandRunner, Vcgencmd, run_command
from agent.hardware.readings import Gpu, Rail, SensorReadings, ThermalZone
from agent.hardware.sysfs import SysFS
from agent.hardware.thermal import read_thermal_zones, unique_names


class Sensors:
    """The sensors under `root`. `runner` runs ``vcgencmd`` (None: never); `ups`, `jtop` and
    `nvml` are the optional sources, built by `from_config` for the daemon and the CLI."""

    def __init__(
        self,
        root: Path | SysFS = Path("/"),
        *,
        runner: CommandRunner | None = run_command,
        ups: Ina219Ups | None = None,
        jtop: JtopSource | None = None,
        nvml: NvmlGpu | None = None,
    ) -> None:
        self.fs = root if isinstance(root, SysFS) else SysFS(root)
        self._vcgencmd = Vcgencmd(runner) if runner is not None else None
        self._pmic = True  # cleared once the firmware says it has no PMIC ADC (before the Pi 5)
        self._ups, self._jtop, self._nvml = ups, jtop, nvml

    @classmethod
    def from_config(
        cls, section: SensorsSection, root: Path | SysFS = Path("/"), board: Board | None = None
    ) -> Sensors:
        """The sources `section` (agent.yaml's ``sensors:``) enables that fit `board`."""
        fs = root if isinstance(root, SysFS) else SysFS(root)
        board = board or probe(fs)
        ups = section.ups
        return cls(
            fs,
            runner=run_command if section.vcgencmd else None,
            ups=Ina219Ups(ups.bus, ups.address, ups.shunt_ohms, ups.empty_v, ups.full_v) if ups else None,
            jtop=JtopSource() if section.jtop and board.kind == "jetson" else None,
            nvml=NvmlGpu() if section.nvml and board.nvidia_gpu and board.kind != "jetson" else None,
        )

    def read(self) -> SensorReadings:
        sources: list[str] = []
        zones = list(read_thermal_zones(self.fs))
        if zones:
            sources.append("thermal")
        rails = read_ina3221_rails(self.fs)
        if rails:
            sources.append("ina3221")
        power_w, power_source = input_power(rails)
        throttled, pmic = None, tuple[Rail, ...]()
        if self._vcgencmd is not None:
            throttled = self._vcgencmd.throttled()
            if throttled is not None:
                sources.append("vcgencmd")
                temp = self._vcgencmd.temp_c()
                zones.append(ThermalZone("vcgencmd", temp))
                pmic = self._vcgencmd.pmic_rails() if self._pmic else ()
                self._pmic = bool(pmic)
        fan = read_fan(self.fs)
        gpu: Gpu | None = read_gpu_load(self.fs)
        for source, found in (("fan", fan), ("devfreq", gpu)):
            if found is not None:
                sources.append(source)
        jtop = self._jtop.read() if self._jtop is not None else None
        if jtop is not None:
            sources.append("jtop")
            if not any(z.temp_c is not None for z in zones):
                zones += jtop.zones
            if not rails:
                rails = jtop.rails
            if power_w is None and jtop.total is not None and jtop.total.power_w is not None:
                power_w, power_source = jtop.total.power_w, jtop.total.name
            fan, gpu = fan or jtop.fan, gpu or jtop.gpu
        if pmic:
            sources.append("pmic")
            if not rails:
                rails = pmic
            if power_w is None:
                power_w, power_source = round(sum(r.power_w or 0.0 for r in pmic), 3), "pmic"
        if gpu is None and self._nvml is not None and (gpu := self._nvml.read()) is not None:
            sources.append("nvml")
        battery = read_power_supply_battery(self.fs)
        if battery is None and self._ups is not None:
            battery = self._ups.read()
        if battery is not None:
            sources.append(battery.source.split("/", 1)[0])
            if power_w is None and battery.discharging and battery.power_w is not None:
                power_w, power_source = battery.power_w, "battery"
        names = unique_names([z.name for z in zones])
        return SensorReadings(
            thermal_zones=tuple(ThermalZone(n, z.temp_c, z.trips) for n, z in zip(names, zones, strict=True)),
            rails=_unique_rails(rails),
            power_w=power_w,
            power_source=power_source,
            battery=battery,
            throttled=throttled,
            fan=fan,
            gpu=gpu,
            sources=tuple(sources),
        )

    def close(self) -> None:
        for source in (self._jtop, self._nvml):
            if source is not None:
                source.close()


def _unique_rails(rails: tuple[Rail, ...]) -> tuple[Rail, ...]:
    names = unique_names([r.name for r in rails])
    return tuple(Rail(n, r.voltage_v, r.current_a, r.power_w) for n, r in zip(names, rails, strict=True))
