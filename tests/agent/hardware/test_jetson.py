"""`agent.hardware.jetson`: jtop fills what sysfs cannot read; without it, sysfs alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from testkit import FAKES

from agent.hardware.jetson import JtopSource
from agent.hardware.sensors import Sensors


class FakeJtop:
    """Test double of a connected ``jtop.jtop`` (jetson-stats' service cannot run here): its
    stats in jetson-stats 4's shapes."""

    def __init__(self) -> None:
        self.temperature = {"cpu": {"temp": 51.2, "online": True}, "cv0": {"temp": -256.0, "online": False}}
        self.power = {
            "rail": {"VDD_CPU_GPU_CV": {"volt": 5064, "curr": 312, "power": 1580}},
            "tot": {"volt": 5072, "curr": 1144, "power": 5802, "name": "VDD_IN"},
        }
        self.fan = {"pwmfan": {"speed": [40.0], "rpm": [2316]}}
        self.gpu = {"gpu": {"status": {"load": 12.3}}}

    def close(self) -> None:
        pass


def test_jtop_fills_what_sysfs_cannot_read(tmp_path: Path) -> None:
    readings = Sensors(tmp_path, runner=None, jtop=JtopSource(FakeJtop)).read()
    assert readings.to_json()["thermal_zones"] == {"jtop:cpu": 51.2}
    assert (readings.power_w, readings.power_source) == (5.802, "VDD_IN")
    assert readings.fan is not None and (readings.fan.duty_percent, readings.fan.rpm) == (40.0, 2316.0)
    assert readings.gpu is not None and readings.gpu.load_percent == 12.3
    assert "jtop" in readings.sources
    # sysfs first where it can be read: the Orin tree's own zones and rails win
    orin = Sensors(FAKES / "jetson-orin-nano", runner=None, jtop=JtopSource(FakeJtop)).read()
    assert "jtop:cpu" not in orin.to_json()["thermal_zones"] and orin.power_source == "VDD_IN"


def test_jtop_absent_or_its_service_down_means_sysfs_only() -> None:
    def service_down() -> Any:
        raise RuntimeError("The jtop.service is not active")

    assert not JtopSource(service_down).connected
    assert JtopSource(service_down).read() is None
    assert not JtopSource().connected  # jetson-stats is not installed here
