"""Hailo's settings (the ``runtimes.hailo`` section of agent.yaml) and its registry entry, apart
from `runtimes.hailo_backend` (the HailoRT wrapper, which the entry names lazily): importing the
registry imports this only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from runtimes.base import Backend, BackendConfig, RuntimeInfo, lazy

KEY = "hailo"
_CODE = "runtimes.hailo_backend"


class HailoConfig(BackendConfig):
    """Settings of the Hailo backend (HailoRT's Python API, ``hailo_platform``)."""

    type: Literal["hailo"] = "hailo"
    timeout_ms: int = Field(
        default=10_000,
        ge=100,
        le=600_000,
        description="How long one inference may take on the Hailo chip before it is an error (milliseconds).",
    )


def device_label(info: RuntimeInfo) -> str:
    """The chip the probe found (``Hailo-8/8L``, ``Hailo-10H``)."""
    return info.devices[0] if info.devices else "Hailo"


BACKEND = Backend(
    name=KEY,
    config=HailoConfig,
    summary="Hailo (the Raspberry Pi AI HAT+ and HAT+ 2) through HailoRT: HEF models compiled for the chip.",
    formats=("hef",),
    # first on an ARM board (the AI HAT+ on a Pi 5): only a .hef artifact and a Hailo device make it usable
    rank={"arm": 5},
    libraries=("hailo_platform",),
    availability=lazy(_CODE, "availability"),
    availability_at=lazy(_CODE, "availability"),
    load=lazy(_CODE, "load"),
    device_label=device_label,
    candidates=lazy(_CODE, "candidates"),
)
