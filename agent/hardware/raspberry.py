"""Raspberry Pi firmware readings through ``vcgencmd``, run by an injectable command runner.

- ``vcgencmd get_throttled`` -> ``throttled=0x50005``: under-voltage, ARM frequency capped,
  throttled and soft temperature limit, now (bits 0-3) and since boot (bits 16-19).
- ``vcgencmd measure_temp`` -> ``temp=47.2'C``.
- ``vcgencmd pmic_read_adc`` (Pi 5 only) -> one line per PMIC channel, e.g.
  ``VDD_CORE_A current(7)=0.83221700A`` and ``VDD_CORE_V volt(15)=0.87624000V``; a rail is a
  name with both a current and a voltage, and their products summed are the power estimate
  (it leaves out USB devices and the input converter's loss).

``vcgencmd`` is looked up on ``PATH`` by the default runner, so a technician or a test puts
another one first (``tests/fakes/rpi5/usr/bin/vcgencmd``). Output that does not parse reads as
unknown. Called from the sampler thread or the CLI; each call starts a process (a few ms on a
Pi), so the sensors call it once per telemetry tick.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence

from agent.hardware.readings import Rail, Throttled, plausible_c

#: runs a command (argv), returns its standard output, or None when it is missing or failed
CommandRunner = Callable[[Sequence[str]], str | None]

_THROTTLED = re.compile(r"throttled=(0x[0-9a-fA-F]+|\d+)")
_TEMP = re.compile(r"temp=(-?[\d.]+)'C")
_PMIC = re.compile(r"^\s*(\S+)_([AV])\s+(?:current|volt)\(\d+\)=(-?[\d.]+)[AV]\s*$")


def run_command(argv: Sequence[str], timeout_s: float = 2.0) -> str | None:
    """Run `argv` (its program found on ``PATH``); its stdout, or None when the program is
    missing, fails, or takes longer than `timeout_s`."""
    program = shutil.which(argv[0])
    if program is None:
        return None
    try:
        done = subprocess.run([program, *argv[1:]], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_throttled(text: str | None) -> Throttled | None:
    match = _THROTTLED.search(text or "")
    return Throttled.from_bits(int(match.group(1), 0)) if match else None


def parse_temp(text: str | None) -> float | None:
    match = _TEMP.search(text or "")
    return plausible_c(float(match.group(1))) if match else None


def parse_pmic(text: str | None) -> tuple[Rail, ...]:
    """The PMIC's rails (name without the ``_A`` / ``_V`` suffix) that have both a current and
    a voltage, in the order the firmware lists their currents."""
    currents: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in (text or "").splitlines():
        match = _PMIC.match(line)
        if match is None:
            continue
        name, unit, value = match.group(1), match.group(2), float(match.group(3))
        (currents if unit == "A" else volts)[name] = value
    return tuple(
        Rail(name, round(volts[name], 4), round(amps, 4), round(volts[name] * amps, 4))
        for name, amps in currents.items()
        if name in volts and volts[name] >= 0 and abs(amps) < 1000
    )


class Vcgencmd:
    """The three firmware queries, through `runner` (default: `run_command`)."""

    def __init__(self, runner: CommandRunner = run_command) -> None:
        self._runner = runner

    def throttled(self) -> Throttled | None:
        return parse_throttled(self._runner(["vcgencmd", "get_throttled"]))

    def temp_c(self) -> float | None:
        return parse_temp(self._runner(["vcgencmd", "measure_temp"]))

    def pmic_rails(self) -> tuple[Rail, ...]:
        return parse_pmic(self._runner(["vcgencmd", "pmic_read_adc"]))
