"""LiteRT's settings (the ``runtimes.litert`` section of agent.yaml) and its registry entry,
apart from `runtimes.litert_backend` (the interpreter's wrapper, which the entry names lazily):
importing the registry, to validate a config or to load another backend, imports this only.
`runtimes.litert_backend` re-exports the settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from runtimes.base import Backend, BackendConfig, lazy

KEY = "litert"
_CODE = "runtimes.litert_backend"


class LiteRTConfig(BackendConfig):
    """Settings of the LiteRT backend."""

    type: Literal["litert"] = "litert"
    num_threads: int | None = Field(
        default=None, ge=1, description="CPU threads for the interpreter; unset = all cores."
    )
    delegate: Path | None = Field(
        default=None, description="Path of an external delegate library, e.g. libedgetpu.so.1."
    )
    delegate_options: dict[str, str] = Field(
        default_factory=dict, description="Options passed to the external delegate."
    )


BACKEND = Backend(
    name=KEY,
    config=LiteRTConfig,
    summary="LiteRT: threads, external delegate.",
    formats=("tflite",),
    rank={"nvidia": 30, "arm": 10, "x86": 20},
    libraries=("ai_edge_litert", "tflite_runtime"),
    availability=lazy(_CODE, "availability"),
    load=lazy(_CODE, "load"),
    tune=lazy(_CODE, "tune"),
    candidates=lazy(_CODE, "candidates"),
)
