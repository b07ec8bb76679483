"""The fans the governor drives: a GPIO pin through gpiozero, or the Jetson's sysfs fan.

- `GpioFan`: gpiozero's ``PWMOutputDevice`` (duty = percent / 100) or ``OutputDevice`` (on
  above 0 %) on a configured pin, with an injected ``pin_factory`` (tests pass gpiozero's
  ``MockFactory``; on a Pi gpiozero picks lgpio or another backend). gpiozero is imported when
  a GPIO fan is configured (the ``rpi`` extra).
- `SysfsFan`: JetPack 5/6 ``pwmfan``'s ``pwm1`` or JetPack 4's ``pwm-fan/target_pwm`` (0-255)
  through `SysFS`. NVIDIA's ``nvfancontrol`` service drives the same file on JetPack 5/6:
  stop it (``systemctl disable --now nvfancontrol``) before giving the fan to the agent.

`open_fan` builds the one agent.yaml's ``governor.fan`` names and raises `FanError` saying why
it cannot. `set` raises `FanError` too; the daemon logs it and keeps governing. One thread
(the daemon's sampler) drives a fan.
"""

from __future__ import annotations

from typing import Any, Protocol

from agent.config.models import FanSection
from agent.hardware.jetson import JETPACK4_FAN, pwmfan_folder
from agent.hardware.sysfs import SysFS


class FanError(Exception):
    """A fan that cannot be opened or set; the message names the pin or file."""


class FanControl(Protocol):
    name: str

    def set(self, percent: float) -> None: ...

    def close(self) -> None: ...


class GpioFan:
    """A fan on GPIO `pin`: PWM at `frequency_hz`, or on/off when `pwm` is false."""

    def __init__(self, pin: int | str, pwm: bool = True, frequency_hz: float = 100.0, pin_factory: Any = None) -> None:
        try:
            from gpiozero import GPIOZeroError, OutputDevice, PWMOutputDevice
        except ImportError as exc:
            raise FanError("a GPIO fan needs gpiozero (pip install 'edge-agent[rpi]')") from exc
        self.name, self.pwm = f"gpio {pin}", pwm
        try:
            if pwm:
                self._device: Any = PWMOutputDevice(pin, frequency=frequency_hz, pin_factory=pin_factory)
            else:
                self._device = OutputDevice(pin, pin_factory=pin_factory)
        except (GPIOZeroError, OSError, ValueError) as exc:
            raise FanError(f"cannot open the fan on GPIO pin {pin}: {exc}") from exc

    def set(self, percent: float) -> None:
        self._device.value = percent / 100 if self.pwm else (1 if percent > 0 else 0)

    def close(self) -> None:
        self._device.close()


class SysfsFan:
    """The Jetson's fan file under `fs` (``pwm1`` or ``target_pwm``, 0-255)."""

    def __init__(self, fs: SysFS) -> None:
        folder = pwmfan_folder(fs)
        if folder is not None:
            self._file = f"{folder}/pwm1"
        elif fs.read_text(f"{JETPACK4_FAN}/target_pwm") is not None:
            self._file = f"{JETPACK4_FAN}/target_pwm"
        else:
            raise FanError(f"no Jetson fan under {fs.root} (no hwmon 'pwmfan', no {JETPACK4_FAN}/target_pwm)")
        self._fs = fs
        self.name = f"sysfs {self._file}"

    def set(self, percent: float) -> None:
        try:
            self._fs.write_text(self._file, f"{round(percent * 255 / 100)}\n")
        except OSError as exc:
            raise FanError(f"cannot write {self._fs.path(self._file)}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        pass


def open_fan(section: FanSection, fs: SysFS, pin_factory: Any = None) -> FanControl | None:
    """The fan agent.yaml's ``governor.fan`` configures (None for ``kind: none``)."""
    if section.kind == "gpio":
        assert section.pin is not None  # the config model requires it
        return GpioFan(section.pin, section.pwm, section.frequency_hz, pin_factory)
    if section.kind == "jetson":
        return SysfsFan(fs)
    return None
