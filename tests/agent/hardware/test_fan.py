"""`agent.hardware.fan`: the fans the governor drives (gpiozero's MockFactory pins, the Jetson's sysfs fan)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from testkit import FAKES

from agent.hardware.readings import Fan
from agent.hardware.sensors import Sensors
from agent.hardware.sysfs import SysFS


def copy_tree(tmp_path: Path, tree: str) -> Path:
    return Path(shutil.copytree(FAKES / tree, tmp_path / tree, symlinks=True))


def test_fans_the_governor_drives(tmp_path: Path) -> None:
    from gpiozero.pins.mock import MockFactory, MockPWMPin

    from agent.config.models import FanSection
    from agent.hardware.fan import FanError, open_fan

    orin = copy_tree(tmp_path, "jetson-orin-nano")
    orin_fan = open_fan(FanSection(kind="jetson"), SysFS(orin))
    assert orin_fan is not None
    orin_fan.set(60)
    assert (orin / "sys/class/hwmon/hwmon2/pwm1").read_text() == "153\n"
    assert Sensors(orin, runner=None).read().fan == Fan(60.0, 2316.0, "pwmfan")
    nano = copy_tree(tmp_path, "jetson-nano")
    fan = open_fan(FanSection(kind="jetson"), SysFS(nano))
    assert fan is not None
    fan.set(100)
    assert (nano / "sys/devices/pwm-fan/target_pwm").read_text() == "255\n"
    with pytest.raises(FanError, match="no Jetson fan under"):
        open_fan(FanSection(kind="jetson"), SysFS(FAKES / "rpi4"))
    (orin / "sys/class/hwmon/hwmon2").rename(tmp_path / "unplugged")  # the fan's device went away
    with pytest.raises(FanError, match=r"cannot write .*pwm1"):
        orin_fan.set(10)

    factory = MockFactory(pin_class=MockPWMPin)
    pwm = open_fan(FanSection(kind="gpio", pin=18), SysFS(tmp_path), factory)
    assert pwm is not None
    pwm.set(25)
    assert factory.pin(18).state == 0.25
    onoff = open_fan(FanSection(kind="gpio", pin=23, pwm=False), SysFS(tmp_path), factory)
    assert onoff is not None
    onoff.set(10)
    assert factory.pin(23).state is True or factory.pin(23).state == 1
    onoff.set(0)
    assert not factory.pin(23).state
    with pytest.raises(FanError, match="GPIO pin 18"):
        open_fan(FanSection(kind="gpio", pin=18), SysFS(tmp_path), factory)  # already in use
    assert open_fan(FanSection(), SysFS(tmp_path)) is None
