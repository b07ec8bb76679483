"""The sensors on fake board trees (tests/fakes/), read end to end through `edge-agent telemetry`,
and each reader on garbage, on files that vanish, and behind its seam (command runner, I2C bus,
jtop, NVML)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from agent.cli import main
from agent.hardware.battery import Ina219Ups, read_power_supply_battery
from agent.hardware.jetson import JtopSource
from agent.hardware.nvidia import NvmlGpu
from agent.hardware.raspberry import Vcgencmd, parse_pmic, parse_throttled, run_command
from agent.hardware.readings import Battery, Fan, Rail, SensorReadings, ThermalZone, Throttled, TripPoint
from agent.hardware.sensors import Sensors
from agent.hardware.sysfs import SysFS
from tests.conftest import FAKES

NO_FLAGS = dict.fromkeys(
    [
        "under_voltage",
        "arm_frequency_capped",
        "throttled",
        "soft_temp_limit",
        "under_voltage_since_boot",
        "arm_frequency_capped_since_boot",
        "throttled_since_boot",
        "soft_temp_limit_since_boot",
    ],
    False,
)
GPU_NONE = {"temp_c": None, "memory_used_mb": None, "memory_total_mb": None, "power_w": None}

EXPECTED: dict[str, dict[str, Any]] = {
    "jetson-orin-nano": {
        "temp_c": 48.5,
        "thermal_zones": {
            "cpu-thermal": 47.5,
            "gpu-thermal": 46.812,
            "cv0-thermal": None,  # -256000: an offline zone, unknown
            "cv1-thermal": None,
            "cv2-thermal": None,
            "soc0-thermal": 45.968,
            "soc1-thermal": 47.062,
            "soc2-thermal": 45.343,
            "tj-thermal": 48.5,
        },
        "power_w": 5.802,  # VDD_IN: 5.072 V x 1.144 A
        "power_source": "VDD_IN",
        "rails": {
            "VDD_IN": {"voltage_v": 5.072, "current_a": 1.144, "power_w": 5.802},
            "VDD_CPU_GPU_CV": {"voltage_v": 5.064, "current_a": 0.312, "power_w": 1.58},
            "VDD_SOC": {"voltage_v": 5.064, "current_a": 0.64, "power_w": 3.241},
        },
        "battery": None,
        "throttled": None,
        "fan": {"duty_percent": 40.0, "rpm": 2316.0},  # pwm1 102 of 255
        "gpu": {"name": "17000000.gpu", "load_percent": 12.3, "freq_mhz": 306.0, **GPU_NONE},
        "sources": ["thermal", "ina3221", "fan", "devfreq"],
    },
    "jetson-nano": {
        "temp_c": 40.5,  # PMIC-Die's constant 100 °C is not a temperature
        "thermal_zones": {
            "AO-therm": 40.5,
            "CPU-therm": 38.0,
            "GPU-therm": 37.5,
            "PLL-therm": 36.0,
            "thermal-fan-est": 37.8,
        },
        "power_w": 6.72,
        "power_source": "POM_5V_IN",
        "rails": {
            "POM_5V_IN": {"voltage_v": 5.0, "current_a": 1.344, "power_w": 6.72},
            "POM_5V_GPU": {"voltage_v": 4.992, "current_a": 0.08, "power_w": 0.399},
            "POM_5V_CPU": {"voltage_v": 4.984, "current_a": 0.402, "power_w": 2.003},
        },
        "battery": None,
        "throttled": None,
        "fan": {"duty_percent": 30.2, "rpm": 1420.0},
        "gpu": {"name": "57000000.gpu", "load_percent": 3.4, "freq_mhz": 76.8, **GPU_NONE},
        "sources": ["thermal", "ina3221", "fan", "devfreq"],
    },
    "rpi4": {
        "temp_c": 52.6,
        "thermal_zones": {"cpu-thermal": 52.582, "vcgencmd": 52.6},
        "power_w": None,  # no PMIC ADC before the Pi 5
        "power_source": None,
        "rails": {},
        "battery": None,
        "throttled": {
            **NO_FLAGS,
            "under_voltage": True,
            "throttled": True,
            "under_voltage_since_boot": True,
            "throttled_since_boot": True,
        },
        "fan": None,
        "gpu": None,
        "sources": ["thermal", "vcgencmd"],
    },
    "rpi5": {
        "temp_c": 61.5,
        "thermal_zones": {"cpu-thermal": 61.45, "vcgencmd": 61.5},
        "power_w": 1.779,
        "power_source": "pmic",
        "battery": None,
        "throttled": NO_FLAGS,
        "fan": {"duty_percent": 29.4, "rpm": 2961.0},
        "gpu": None,
        "sources": ["thermal", "vcgencmd", "fan", "pmic"],
    },
    "laptop-battery": {
        "temp_c": 52.0,
        "thermal_zones": {"acpitz": 45.0, "x86_pkg_temp": 52.0, "iwlwifi_1": None},
        "power_w": 12.119,  # discharging: 11.87 V x 1.021 A
        "power_source": "battery",
        "rails": {},
        "battery": {
            "percent": 57.0,
            "status": "Discharging",
            "voltage_v": 11.87,
            "current_a": 1.021,
            "power_w": 12.119,
        },
        "throttled": None,
        "fan": None,
        "gpu": None,
        "sources": ["thermal", "power_supply"],
    },
    "x86-generic": {
        "temp_c": None,
        "thermal_zones": {},
        "power_w": None,
        "power_source": None,
        "rails": {},
        "battery": None,
        "throttled": None,
        "fan": None,
        "gpu": None,
        "sources": [],
    },
}


def on_path(monkeypatch: pytest.MonkeyPatch, tree: Path) -> None:
    """The tree's fake ``vcgencmd`` first on PATH, as a technician would put another one."""
    monkeypatch.setenv("PATH", f"{tree / 'usr/bin'}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.parametrize("tree", sorted(EXPECTED))
def test_each_fake_board_reads_end_to_end(tree: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    on_path(monkeypatch, FAKES / tree)
    assert main(["telemetry", "--once", "--json", "--root", str(FAKES / tree)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document) == {"board", "sensors"}
    sensors = document["sensors"]
    expected = EXPECTED[tree]
    assert {key: sensors[key] for key in expected} == expected
    assert set(sensors) >= {"temp_c", "thermal_zones", "power_w", "rails", "battery", "throttled", "fan", "gpu"}


def test_pi5_power_is_the_sum_of_the_pmic_rails(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, FAKES / "rpi5")
    readings = Sensors(FAKES / "rpi5").read()
    assert len(readings.rails) == 12  # EXT5V_V and BATT_V have no current: not rails
    vdd_core = next(r for r in readings.rails if r.name == "VDD_CORE")
    assert (vdd_core.voltage_v, vdd_core.current_a, vdd_core.power_w) == (0.881, 0.7328, 0.6456)
    assert readings.power_w == pytest.approx(sum(r.power_w or 0 for r in readings.rails), abs=0.002)


def test_the_text_table_names_every_reading(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    assert main(["telemetry", "--root", str(FAKES / "jetson-orin-nano")]) == 0
    out = capsys.readouterr().out
    assert "48.5 °C  (hottest of 9 zone(s))" in out
    assert "5.802 W  (VDD_IN)" in out
    assert "WARM 84.0 / HOT 94.0 / CRITICAL 99.5 °C (from trip points)" in out
    assert "40.0 %  2316 rpm" in out


def test_watch_repeats_as_json_lines(capsys) -> None:
    assert main(["telemetry", "--watch", "0.1", "--count", "3", "--json", "--root", str(FAKES / "jetson-nano")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["sensors"]["power_w"] for line in lines] == [6.72, 6.72, 6.72]


@pytest.mark.parametrize("args", [["--watch", "0"], ["--watch", "x"], ["--once", "--watch", "1"]])
def test_bad_watch_arguments_are_usage_errors(args: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["telemetry", *args])
    assert exit_info.value.code == 2


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
    for n in range(3):
        zone = tmp_path / f"sys/class/thermal/thermal_zone{n if n < 2 else 10}"
        zone.mkdir(parents=True)
        (zone / "type").write_text("acpitz\n")
        (zone / "temp").write_text(f"{40000 + n * 1000}\n")
    readings = Sensors(tmp_path, runner=None).read()
    assert readings.to_json()["thermal_zones"] == {"acpitz": 40.0, "acpitz_1": 41.0, "acpitz_2": 42.0}


def test_battery_garbage_and_peripheral_batteries(tmp_path: Path) -> None:
    root = copy_tree(tmp_path, "laptop-battery")
    bat0 = root / "sys/class/power_supply/BAT0"
    (bat0 / "capacity").write_text("-5\n")
    (bat0 / "voltage_now").write_text("N/A\n")
    battery = read_power_supply_battery(SysFS(root))
    assert battery == Battery(None, "Discharging", None, 1.021, None, "power_supply/BAT0")
    shutil.rmtree(bat0)
    assert read_power_supply_battery(SysFS(root)) is None  # the mouse (scope Device) is not the board's


@pytest.mark.parametrize(
    ("text", "flags"),
    [
        ("throttled=0x0\n", set()),
        ("throttled=0x50005\n", {"under_voltage", "throttled", "under_voltage_since_boot", "throttled_since_boot"}),
        ("throttled=0x80008", {"soft_temp_limit", "soft_temp_limit_since_boot"}),
        ("throttled=0x20002", {"arm_frequency_capped", "arm_frequency_capped_since_boot"}),
    ],
)
def test_get_throttled_bits(text: str, flags: set[str]) -> None:
    throttled = parse_throttled(text)
    assert throttled is not None
    assert {name for name, value in vars(throttled).items() if value is True} == flags
    assert throttled.any_now == bool({"under_voltage", "arm_frequency_capped", "throttled", "soft_temp_limit"} & flags)


@pytest.mark.parametrize("text", [None, "", 'error=2 error_msg="Command not registered"', "throttled=zz"])
def test_vcgencmd_garbage_reads_unknown(text: str | None) -> None:
    vcgencmd = Vcgencmd(lambda argv: text)
    assert vcgencmd.throttled() is None and vcgencmd.temp_c() is None and vcgencmd.pmic_rails() == ()
    assert parse_pmic("VDD_CORE_A current(7)=0.5A\nVDD_CORE_V volt(15)=nanV\n") == ()


def test_the_runner_finds_vcgencmd_on_path_and_reports_a_missing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    on_path(monkeypatch, FAKES / "rpi4")
    assert run_command(["vcgencmd", "get_throttled"]) == "throttled=0x50005\n"
    assert run_command(["vcgencmd", "pmic_read_adc"]) is None  # exit 255 on a Pi 4
    monkeypatch.setenv("EDGE_AGENT_FAKE_THROTTLED", "0x4")
    assert run_command(["vcgencmd", "get_throttled"]) == "throttled=0x4\n"
    monkeypatch.setenv("PATH", str(FAKES / "x86-generic"))  # no vcgencmd anywhere on it
    assert run_command(["vcgencmd", "get_throttled"]) is None


def test_a_pi4_stops_asking_for_the_pmic_after_it_said_no() -> None:
    calls: list[str] = []

    def runner(argv: Any) -> str | None:
        calls.append(argv[1])
        return {"get_throttled": "throttled=0x0", "measure_temp": "temp=50.0'C"}.get(argv[1])

    sensors = Sensors(FAKES / "x86-generic", runner=runner)
    sensors.read()
    sensors.read()
    assert calls == ["get_throttled", "measure_temp", "pmic_read_adc", "get_throttled", "measure_temp"]


class FakeSMBus:
    """Test double of ``smbus2.SMBus`` (no I2C bus here): the INA219's registers as the bus
    returns them, least significant byte first."""

    def __init__(self, registers: dict[int, int]) -> None:
        self.registers, self.closed = registers, False

    def read_word_data(self, i2c_addr: int, register: int) -> int:
        if i2c_addr != 0x42:
            raise OSError(121, "Remote I/O error")
        value = self.registers[register]
        return ((value & 0xFF) << 8) | (value >> 8)

    def close(self) -> None:
        self.closed = True


def test_ina219_ups_reading() -> None:
    # bus 7.4 V (1850 << 3), shunt -0.05 V (-5000 x 10 µV): 0.5 A out of the pack
    bus = FakeSMBus({0x02: 1850 << 3, 0x01: 0x10000 - 5000})
    battery = Ina219Ups(bus_factory=lambda number: bus).read()
    assert battery == Battery(58.3, "Discharging", 7.4, -0.5, 3.7, "ina219/1-0042")
    assert bus.closed
    assert Ina219Ups(address=0x40, bus_factory=lambda number: bus).read() is None  # nothing answers there


def test_ups_feeds_the_battery_and_the_board_power(tmp_path: Path) -> None:
    bus = FakeSMBus({0x02: 1850 << 3, 0x01: 0x10000 - 5000})
    readings = Sensors(tmp_path, runner=None, ups=Ina219Ups(bus_factory=lambda n: bus)).read()
    assert readings.battery is not None and readings.battery.percent == 58.3
    assert (readings.power_w, readings.power_source) == (3.7, "battery")


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


def test_nvml_without_a_driver_reports_nothing() -> None:
    gpu = NvmlGpu()  # the real pynvml: no libnvidia-ml on this machine (a GPU machine has one)
    if gpu.available:
        pytest.skip("an NVIDIA driver is present: see test_nvml_on_a_real_gpu")
    assert gpu.read() is None


def test_nvml_readings_through_its_api() -> None:
    class FakeNvml:
        """Test double of the pynvml module: one GPU, power not supported."""

        NVML_TEMPERATURE_GPU = 0

        def nvmlInit(self) -> None: ...
        def nvmlShutdown(self) -> None: ...
        def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
            return "gpu0"

        def nvmlDeviceGetName(self, handle: str) -> bytes:
            return b"NVIDIA GeForce RTX 3060"

        def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
            return 57

        def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
            return SimpleNamespace(gpu=83, memory=20)

        def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
            return SimpleNamespace(used=3 * 2**30, total=12 * 2**30)

        def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    gpu = NvmlGpu(nvml=FakeNvml).read()
    assert gpu is not None
    assert (gpu.name, gpu.load_percent, gpu.temp_c, gpu.memory_used_mb, gpu.memory_total_mb, gpu.power_w) == (
        "NVIDIA GeForce RTX 3060",
        83.0,
        57.0,
        3072.0,
        12288.0,
        None,
    )


def test_nvml_on_a_real_gpu() -> None:
    """Runs where an NVIDIA driver is present (a GPU machine); skipped elsewhere."""
    gpu = NvmlGpu()
    if not gpu.available:
        pytest.skip("no NVIDIA driver here")
    reading = gpu.read()
    gpu.close()
    assert reading is not None and reading.name
    assert reading.temp_c is not None and 0 < reading.temp_c < 110
    assert reading.memory_total_mb is not None and reading.memory_total_mb > 1000
    assert reading.load_percent is not None and 0 <= reading.load_percent <= 100


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ThermalZone("cpu", 500.0), "ThermalZone.temp_c: expected a number within -60.0..200.0, got 500.0"),
        (lambda: Battery(101.0, None, None, None, None, "x"), "Battery.percent"),
        (lambda: SensorReadings((ThermalZone("a", 1.0), ThermalZone("a", 2.0))), "names must be unique"),
        (lambda: ThermalZone("cpu", float("nan")), "got nan"),
    ],
)
def test_readings_are_checked_at_construction(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        build()


def test_throttled_from_bits_keeps_the_raw_value() -> None:
    assert Throttled.from_bits(0x50005).raw == 0x50005


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


def test_probe_lists_the_sensors_found(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    on_path(monkeypatch, FAKES / "jetson-nano")
    assert main(["probe", "--json", "--root", str(FAKES / "jetson-nano")]) == 0
    assert json.loads(capsys.readouterr().out)["sensors"] == {
        "thermal": "5 zone(s): AO-therm, CPU-therm, GPU-therm, PLL-therm, thermal-fan-est",
        "ina3221": "rails POM_5V_IN, POM_5V_GPU, POM_5V_CPU; board power from POM_5V_IN",
        "fan": "pwm-fan",
        "devfreq": "GPU 57000000.gpu",
    }
    assert main(["probe", "--root", str(FAKES / "x86-generic")]) == 0
    assert "sensors: none found" in capsys.readouterr().out


@pytest.mark.parametrize("tree", ["jetson-orin-nano", "jetson-nano", "laptop-battery"])
def test_a_captured_tree_reads_as_the_board_did(tree: str, tmp_path: Path) -> None:
    """scripts/capture_board.sh copies what the sensors read, values only."""
    import subprocess

    from tests.conftest import REPO

    env = {**os.environ, "CAPTURE_ROOT": str(FAKES / tree)}
    subprocess.run([str(REPO / "scripts/capture_board.sh"), str(tmp_path / "captured")], env=env, check=True)
    assert Sensors(tmp_path / "captured", runner=None).read() == Sensors(FAKES / tree, runner=None).read()
    assert not (tmp_path / "captured/sys/class/power_supply/BAT0/model_name").exists()
