"""A discrete NVIDIA GPU through NVML (nvidia-ml-py's ``pynvml``, the ``nvidia`` extra).

Temperature (°C), load (percent, ``utilization.gpu``), memory used and total (MiB), power
(``nvmlDeviceGetPowerUsage``, mW -> W) of GPU `index`. Used where the probe found a discrete
GPU; without ``pynvml`` or the driver's ``libnvidia-ml`` it reports nothing, and a query the
GPU does not support reads as None. `nvml` is the ``pynvml`` module (injectable for tests).
Called from the sampler thread; `close` shuts NVML down.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agent.hardware.readings import Gpu, plausible_c

log = logging.getLogger(__name__)


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


class NvmlGpu:
    """GPU `index` through NVML, or nothing when NVML cannot start here."""

    def __init__(self, index: int = 0, nvml: Callable[[], Any] = _import_pynvml) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        self.name = ""
        try:
            module = nvml()
            module.nvmlInit()
        except ImportError:
            log.debug("NVML: nvidia-ml-py is not installed")
            return
        except Exception as exc:  # pynvml.NVMLError: no driver library, no GPU
            log.info("NVML: not available here (%s)", exc)
            return
        try:
            self._handle = module.nvmlDeviceGetHandleByIndex(index)
            name = module.nvmlDeviceGetName(self._handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
            self._nvml = module
        except Exception as exc:
            log.info("NVML: GPU %d not available (%s)", index, exc)
            module.nvmlShutdown()

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def _query(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self._nvml, function)(self._handle, *args)
        except Exception:  # NVMLError_NotSupported and friends: unknown
            return None

    def read(self) -> Gpu | None:
        if self._nvml is None:
            return None
        temp = self._query("nvmlDeviceGetTemperature", self._nvml.NVML_TEMPERATURE_GPU)
        utilization = self._query("nvmlDeviceGetUtilizationRates")
        memory = self._query("nvmlDeviceGetMemoryInfo")
        power_mw = self._query("nvmlDeviceGetPowerUsage")
        load = getattr(utilization, "gpu", None)
        return Gpu(
            name=self.name,
            load_percent=float(load) if isinstance(load, int | float) and 0 <= load <= 100 else None,
            temp_c=plausible_c(float(temp)) if isinstance(temp, int | float) else None,
            memory_used_mb=round(memory.used / 2**20, 1) if memory is not None else None,
            memory_total_mb=round(memory.total / 2**20, 1) if memory is not None else None,
            power_w=round(power_mw / 1000, 2) if isinstance(power_mw, int | float) else None,
        )

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("NVML: shutdown failed: %s", exc)
            self._nvml = None
