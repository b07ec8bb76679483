"""`agent.hardware.nvidia`: NVML without a driver, through its API, and on a real GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from agent.hardware.nvidia import NvmlGpu


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
