"""Jetson specifics through `SysFS`: the fan, the integrated GPU's load, and jtop when it runs.

- Fan, JetPack 5/6: the ``pwmfan`` hwmon device (``sys/class/hwmon/hwmon*/name`` = ``pwmfan``)
  with ``pwm1`` (0-255); its speed from a hwmon ``rpm`` file (Orin's tachometer) or
  ``fan1_input``. JetPack 4: ``sys/devices/pwm-fan/{target_pwm,cur_pwm,rpm_measured}``.
- GPU load: the devfreq device whose ``device/load`` exists (``17000000.gpu`` on Orin,
  ``57000000.gpu`` on Nano), in per mille; ``cur_freq`` in Hz.
- jtop (jetson-stats, AGPL-3.0, the optional ``jtop`` extra): when its service answers, its
  temperatures, rails, fan and GPU fill what sysfs could not read (its service runs as root).

Readers never raise; the jtop adapter connects once and is closed by its owner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.hardware.readings import Fan, Gpu, Rail, ThermalZone, plausible_c
from agent.hardware.sysfs import SysFS

log = logging.getLogger(__name__)

JETPACK4_FAN = "sys/devices/pwm-fan"


def pwmfan_folder(fs: SysFS) -> str | None:
    """The hwmon folder of the ``pwmfan`` device (JetPack 5/6), or None."""
    for name_path in fs.glob("sys/class/hwmon/hwmon*/name"):
        if fs.read_text(name_path) == "pwmfan":
            return name_path.rsplit("/", 1)[0]
    return None


def _duty(pwm: float | None) -> float | None:
    return round(pwm / 255 * 100, 1) if pwm is not None and 0 <= pwm <= 255 else None


def _rpm(value: float | None) -> float | None:
    return value if value is not None and 0 <= value < 100_000 else None


def read_fan(fs: SysFS) -> Fan | None:
    """The Jetson (or any hwmon ``pwmfan``) fan's duty and speed, or None without one."""
    folder = pwmfan_folder(fs)
    if folder is not None:
        rpm = fs.read_number(f"{folder}/fan1_input")
        if rpm is None:
            rpm = next((v for p in fs.glob("sys/class/hwmon/hwmon*/rpm") if (v := fs.read_number(p)) is not None), None)
        return Fan(_duty(fs.read_number(f"{folder}/pwm1")), _rpm(rpm), "pwmfan")
    if fs.read_text(f"{JETPACK4_FAN}/target_pwm") is not None:
        pwm = fs.read_number(f"{JETPACK4_FAN}/cur_pwm")
        if pwm is None:
            pwm = fs.read_number(f"{JETPACK4_FAN}/target_pwm")
        return Fan(_duty(pwm), _rpm(fs.read_number(f"{JETPACK4_FAN}/rpm_measured")), "pwm-fan")
    return None


def read_gpu_load(fs: SysFS) -> Gpu | None:
    """The integrated GPU's load (percent) and clock (MHz) from devfreq, or None."""
    for load_path in fs.glob("sys/class/devfreq/*/device/load"):
        folder = load_path[: -len("/device/load")]
        load = fs.read_number(load_path)
        freq = fs.read_number(f"{folder}/cur_freq")
        return Gpu(
            name=folder.rsplit("/", 1)[1],
            load_percent=round(load / 10, 1) if load is not None and 0 <= load <= 1000 else None,
            freq_mhz=round(freq / 1e6, 1) if freq is not None and freq >= 0 else None,
        )
    return None


@dataclass(frozen=True)
class JtopReadings:
    """What jtop reported at one moment (None or empty where it had nothing); `total` is the
    board's input rail as jtop names it."""

    zones: tuple[ThermalZone, ...]
    rails: tuple[Rail, ...]
    total: Rail | None
    fan: Fan | None
    gpu: Gpu | None


def _mrail(name: str, values: Mapping[str, Any]) -> Rail:
    def milli(key: str) -> float | None:
        value = values.get(key)
        return round(float(value) / 1000, 3) if isinstance(value, int | float) and value >= 0 else None

    return Rail(name, milli("volt"), milli("curr"), milli("power"))


def _first_number(values: Any) -> float | None:
    if isinstance(values, list | tuple) and values and isinstance(values[0], int | float):
        return float(values[0])
    return None


def jtop_readings(jetson: Any) -> JtopReadings:
    """Map a connected ``jtop.jtop`` object's stats (jetson-stats 4: temperatures in °C; rails
    in mV, mA, mW; fan speed in percent) to readings. Anything missing or odd is left out."""
    temperature = getattr(jetson, "temperature", {}) or {}
    zones = tuple(
        ThermalZone(f"jtop:{name}", plausible_c(float(v["temp"])))
        for name, v in temperature.items()
        if isinstance(v, Mapping) and v.get("online", True) and isinstance(v.get("temp"), int | float)
    )
    power = getattr(jetson, "power", {}) or {}
    rails = tuple(_mrail(n, v) for n, v in (power.get("rail") or {}).items() if isinstance(v, Mapping))
    tot = power.get("tot")
    total = _mrail(str(tot.get("name", "total")), tot) if isinstance(tot, Mapping) else None
    fans = getattr(jetson, "fan", {}) or {}
    fan = None
    for values in fans.values():
        if isinstance(values, Mapping):
            speed = _first_number(values.get("speed"))
            duty = speed if speed is not None and 0 <= speed <= 100 else None
            fan = Fan(duty, _rpm(_first_number(values.get("rpm"))), "jtop")
            break
    gpu = None
    for name, values in (getattr(jetson, "gpu", {}) or {}).items():
        load = (values.get("status") or {}).get("load") if isinstance(values, Mapping) else None
        if isinstance(load, int | float):
            gpu = Gpu(name=str(name), load_percent=round(float(load), 1) if 0 <= load <= 100 else None)
            break
    return JtopReadings(zones, rails, total, fan, gpu)


def _connect_jtop() -> Any:
    from jtop import jtop  # jetson-stats: the optional `jtop` extra (AGPL-3.0)

    jetson = jtop()
    jetson.start()
    return jetson


class JtopSource:
    """jtop's service, when jetson-stats is installed and the service answers; `read` returns
    None otherwise. `connect` makes a started ``jtop`` object (injectable for tests)."""

    def __init__(self, connect: Callable[[], Any] = _connect_jtop) -> None:
        self._jetson: Any = None
        try:
            self._jetson = connect()
        except ImportError:
            log.debug("jtop: jetson-stats is not installed; reading sysfs only")
        except Exception as exc:  # jtop raises its own JtopException when the service is down
            log.info("jtop: its service did not answer (%s); reading sysfs only", exc)

    @property
    def connected(self) -> bool:
        return self._jetson is not None

    def read(self) -> JtopReadings | None:
        if self._jetson is None:
            return None
        try:
            return jtop_readings(self._jetson)
        except Exception as exc:  # a disconnected service raises from its properties
            log.warning("jtop: reading failed (%s); reading sysfs only", exc)
            return None

    def close(self) -> None:
        if self._jetson is not None:
            try:
                self._jetson.close()
            except Exception as exc:
                log.debug("jtop: close failed: %s", exc)
            self._jetson = None
