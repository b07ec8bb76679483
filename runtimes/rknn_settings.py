"""Rockchip RKNN's settings (the ``runtimes.rknn`` section of agent.yaml), its registry entry,
and the Rockchip SoCs whose NPU it drives, apart from `runtimes.rknn_backend` (the wrapper of
``rknnlite``, which the entry names lazily): importing the registry imports this only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import Field

from runtimes.base import Backend, BackendConfig, lazy

KEY = "rknn"
_CODE = "runtimes.rknn_backend"

#: the SoCs whose NPU rknn-toolkit-lite2 drives and ``bundle build --rknn`` converts for: the
#: toolkit's ``target_platform`` names (an RK3588S is an RK3588 to the toolkit)
PLATFORMS: tuple[str, ...] = ("rk3588", "rk3566", "rk3568")
_COMPATIBLE = re.compile(r"^rockchip,(rk3588|rk3566|rk3568)s?$")

#: RKNNLite's ``core_mask`` values (rknn-toolkit-lite2's ``RKNNLite.NPU_CORE_*``): the RK3588 has
#: three NPU cores; the RK3566/RK3568 one, where the mask is not passed at all
CORE_MASKS: dict[str, int] = {"auto": 0, "0": 1, "1": 2, "2": 4, "0_1": 3, "0_1_2": 7, "all": 0xFFFF}
CoreMask = Literal["auto", "0", "1", "2", "0_1", "0_1_2", "all"]


def rockchip_soc(compatible: Iterable[str]) -> str | None:
    """The RKNN platform (``rk3588``) named by a device tree's ``compatible`` strings (the file
    ``/proc/device-tree/compatible``, split at its NULs: ``radxa,rock-5b``, ``rockchip,rk3588``);
    None on any other board."""
    for entry in compatible:
        match = _COMPATIBLE.match(entry.strip().lower())
        if match:
            return match.group(1)
    return None


class RKNNConfig(BackendConfig):
    """Settings of the Rockchip NPU backend (rknn-toolkit-lite2)."""

    type: Literal["rknn"] = "rknn"
    core_mask: CoreMask = Field(
        default="auto",
        description="The RK3588's NPU cores a model runs on (RKNNLite's core_mask): auto (the driver picks), "
        "0, 1, 2, 0_1, 0_1_2 or all. Ignored on the single-core RK3566/RK3568.",
    )


BACKEND = Backend(
    name=KEY,
    config=RKNNConfig,
    summary="Rockchip RKNN (rknn-toolkit-lite2): the NPU cores a model runs on.",
    # a model converted by bundle build --rknn for the board's SoC; nothing else
    formats=("rknn",),
    # first on a board with a Rockchip NPU (socs), and only for an .rknn model converted for its SoC
    rank={"arm": 5},
    socs=PLATFORMS,
    libraries=("rknnlite",),
    availability=lazy(_CODE, "availability"),
    availability_at=lazy(_CODE, "availability"),
    load=lazy(_CODE, "load"),
    device_label=lambda info: info.devices[0] if info.devices else "NPU",
    candidates=lazy(_CODE, "candidates"),
)
