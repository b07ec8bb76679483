"""Hardware probe: what board this is, read from a filesystem root.

`probe(root)` reads only files under `root` (default ``/``) through `SysFS`, so tests point it
at fake trees under ``tests/fakes/<board>/`` shaped like the real boards':

- ``proc/device-tree/model`` (NUL-terminated), e.g. ``Raspberry Pi 5 Model B Rev 1.0``
- ``etc/nv_tegra_release``, e.g. ``# R36 (release), REVISION: 3.0, ...`` on Jetson (L4T)
- ``proc/driver/nvidia/gpus/*/information`` with a ``Model:`` line on a discrete NVIDIA GPU
- ``sys/devices/system/cpu/online``, e.g. ``0-3``
- ``dev/hailo0`` and its PCIe id (``sys/class/*/hailo0/device/device``, ``0x2864``): a Hailo
  chip, the Raspberry Pi AI HAT+ (`runtimes.hailo_device.find_devices`)
- ``proc/device-tree/compatible`` (NUL-separated), e.g. ``radxa,rock-5b`` ``rockchip,rk3588``: a
  Rockchip SoC whose NPU the ``rknn`` runtime drives (`Board.soc`)
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.hardware.sysfs import SysFS
from runtimes.hailo_device import find_devices
from runtimes.rknn_settings import rockchip_soc

BoardKind = Literal["jetson", "raspberry_pi", "generic"]

_L4T_RE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)")


@dataclass(frozen=True)
class Board:
    """The device as the probe found it.

    `model` is the device-tree model string (or ``generic <arch>``); `l4t_release` is the Jetson
    Linux release such as ``36.3.0``; `gpu_name` names the NVIDIA GPU when there is one; `hailo`
    the first Hailo chip (``Hailo-8/8L``: the AI HAT+; ``Hailo-10H``: the AI HAT+ 2); `soc` the
    Rockchip SoC with an NPU (``rk3588``, ``rk3566``, ``rk3568``) when the board has one; `root`
    the filesystem root it was read from (``/``; a fake tree in tests and ``probe --root``), where
    the runtimes that drive a device look for it too (`runtimes.base.LoadOptions.root`).
    """

    kind: BoardKind
    model: str
    arch: str
    cpu_count: int
    nvidia_gpu: bool
    gpu_name: str | None = None
    l4t_release: str | None = None
    hailo: str | None = None
    soc: str | None = None
    root: str = "/"


def _count_cpus(spec: str) -> int:
    """Count the CPUs in a sysfs list such as ``0-3,6`` (returns 0 when it cannot be parsed)."""
    total = 0
    for part in spec.split(","):
        bounds = part.strip().split("-")
        try:
            if len(bounds) == 1 and bounds[0]:
                total += 1
            elif len(bounds) == 2:
                total += int(bounds[1]) - int(bounds[0]) + 1
        except ValueError:
            return 0
    return total


def _l4t_release(text: str | None) -> str | None:
    if not text:
        return None
    match = _L4T_RE.search(text)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def _discrete_gpu(fs: SysFS) -> str | None:
    """Name of the first NVIDIA GPU the driver lists, or ``None``."""
    for entry in fs.listdir("proc/driver/nvidia/gpus"):
        info = fs.read_text(f"proc/driver/nvidia/gpus/{entry}/information") or ""
        for line in info.splitlines():
            if line.startswith("Model:"):
                return line.split(":", 1)[1].strip()
        return "NVIDIA GPU"
    return None


def probe(root: Path | SysFS = Path("/"), arch: str | None = None) -> Board:
    """Identify the board under `root` (a folder or a `SysFS`). `arch` defaults to this
    machine's ``platform.machine()``."""
    fs = root if isinstance(root, SysFS) else SysFS(root)
    arch = arch or platform.machine()
    model = fs.read_text("proc/device-tree/model") or fs.read_text("sys/firmware/devicetree/base/model")
    l4t = _l4t_release(fs.read_text("etc/nv_tegra_release"))
    cpus = _count_cpus(fs.read_text("sys/devices/system/cpu/online") or "") or os.cpu_count() or 1
    hailo = next((device.family for device in find_devices(fs.root)), None)
    where = str(fs.root)
    if l4t is not None or (model and "jetson" in model.lower()):
        return Board("jetson", model or "NVIDIA Jetson", arch, cpus, True, model or "Tegra", l4t, hailo, root=where)
    gpu = _discrete_gpu(fs)
    if model and model.startswith("Raspberry Pi"):
        return Board("raspberry_pi", model, arch, cpus, gpu is not None, gpu, hailo=hailo, root=where)
    soc = rockchip_soc((fs.read_text_raw("proc/device-tree/compatible") or "").split("\x00"))
    return Board(
        "generic", model or f"generic {arch}", arch, cpus, gpu is not None, gpu, hailo=hailo, soc=soc, root=where
    )
