"""`edge-agent probe`: JSON and text, the camera tools, the sensors found."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from testkit import FAKES

from agent.cli import main


def test_probe_reports_the_camera_tools(gst: str, capsys) -> None:
    assert main(["probe", "--json"]) == 0
    cameras = json.loads(capsys.readouterr().out)["cameras"]
    assert cameras["gst_launch"]["path"] and "gst_elements" not in cameras
    assert main(["probe"]) == 0
    out = capsys.readouterr().out
    assert "camera tools:" in out and "GStreamer hardware decoders:" in out


@pytest.mark.parametrize(
    ("tree", "arch", "kind", "onnx_runtime", "tflite_runtime"),
    [
        ("rpi5", "aarch64", "raspberry_pi", "onnxruntime", "litert"),
        ("x86-generic", "x86_64", "generic", "onnxruntime", "litert"),
        ("jetson-orin-nano", "aarch64", "jetson", "onnxruntime", "litert"),
    ],
)
def test_probe_json(capsys, tree, arch, kind, onnx_runtime, tflite_runtime) -> None:
    assert main(["probe", "--json", "--root", str(FAKES / tree), "--arch", arch]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["board"]["kind"] == kind
    assert report["runtimes"]["onnxruntime"]["available"]
    assert report["selection"]["onnx"]["runtime"] == onnx_runtime
    assert report["selection"]["tflite"]["runtime"] == tflite_runtime
    assert report["selection"]["onnx"]["reason"]


def test_probe_text(capsys) -> None:
    assert main(["probe", "--root", str(FAKES / "rpi5"), "--arch", "aarch64"]) == 0
    out = capsys.readouterr().out
    assert "Raspberry Pi 5 Model B Rev 1.0 (raspberry_pi, aarch64, 4 CPUs)" in out
    assert ".tflite  -> litert: Raspberry Pi aarch64: litert on xnnpack is preferred" in out


def test_probe_on_a_rock_5b_names_its_npu_and_why_rknn_cannot_run_here(capsys) -> None:
    """The RK3588 from the tree's device tree; rknnlite (aarch64 only) does not import here."""
    assert main(["probe", "--json", "--root", str(FAKES / "rock5b"), "--arch", "aarch64"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["board"]["soc"] == "rk3588" and report["board"]["model"] == "Radxa ROCK 5B"
    assert not report["runtimes"]["rknn"]["available"]
    assert report["selection"]["rknn"]["runtime"] is None
    assert "rknn: rknnlite does not import" in report["selection"]["rknn"]["reason"]
    assert main(["probe", "--root", str(FAKES / "rock5b"), "--arch", "aarch64"]) == 0
    assert "npu:      RK3588 (runtime rknn" in capsys.readouterr().out


def on_path(monkeypatch: pytest.MonkeyPatch, tree: Path) -> None:
    """The tree's fake ``vcgencmd`` first on PATH, as a technician would put another one."""
    monkeypatch.setenv("PATH", f"{tree / 'usr/bin'}{os.pathsep}{os.environ['PATH']}")


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


def test_probe_names_the_hailo_chip_and_why_a_hef_cannot_run_without_hailort(capsys) -> None:
    # fails on: the chip left out of the report, or the .hef row saying nothing of hailo
    assert main(["probe", "--json", "--root", str(FAKES / "rpi5-hailo8l"), "--arch", "aarch64"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["board"]["hailo"] == "Hailo-8/8L"
    hailo = report["runtimes"]["hailo"]
    assert (
        hailo["available"]
        or "hailo_platform does not import" in hailo["reason"]
        or "no Hailo device" in hailo["reason"]
    )
    assert report["selection"]["hef"]["runtime"] == ("hailo" if hailo["available"] else None)
    assert "hailo: " in report["selection"]["hef"]["reason"]
    assert main(["probe", "--root", str(FAKES / "rpi5-hailo10h"), "--arch", "aarch64"]) == 0
    assert "hailo:    Hailo-10H" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("tree", "available", "words"),
    [
        ("rpi5-hailo8l", True, "Hailo-8/8L"),
        ("rpi5-hailo10h", True, "Hailo-10H"),
        ("rpi5", False, "no Hailo device: no /dev/hailo*"),
    ],
)
def test_probe_looks_for_the_hailo_chip_under_root_not_this_machine(
    tree: str, available: bool, words: str, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """With HailoRT's double importable in the probe child (`tests/standins/hailo`), the chip is the
    tree's: found on the HAT+ trees, missing on a plain Pi 5, whatever this machine has."""
    # fails on: HailoRT's availability looking at this machine's /dev (no chip: never available)
    from testkit import standin_env

    from runtimes import isolation

    monkeypatch.setattr(isolation, "PROCESS_RUNNER", isolation.ChildRunner(env=standin_env("hailo")))
    assert main(["probe", "--json", "--root", str(FAKES / tree), "--arch", "aarch64"]) == 0
    report = json.loads(capsys.readouterr().out)
    hailo = report["runtimes"]["hailo"]
    assert hailo["available"] is available, hailo
    assert words in (hailo["devices"][0] if available else hailo["reason"]), hailo
    assert report["selection"]["hef"]["runtime"] == ("hailo" if available else None), report["selection"]["hef"]
    assert report["board"]["root"] == str(FAKES / tree)
