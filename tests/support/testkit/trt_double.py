"""The TensorRT test double (tests/fakes/tensorrt_double), installed for one test.

``trt_double`` puts the double first on ``sys.path`` (so ``import tensorrt`` finds it), gives it
a fresh fake GPU, and makes the device-memory seam (`runtimes.cuda_memory.IMPLEMENTATIONS`)
hand out the double's host memory, so the code under test runs unchanged. Yields a `TrtDouble`.

The double, its fake GPU and its memory live only in the test's process, so TensorRT is probed
and its first loads are checked here instead of in a check process (`runtimes.isolation`: a
child would find neither); the other backends still go through their check processes.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from testkit import FAKES

DOUBLE = FAKES / "tensorrt_double"


@dataclass
class TrtDouble:
    trt: ModuleType  # the double's `tensorrt` module
    internals: Any  # its `_double` module: GPU, UNSUPPORTED_OPS, HostDeviceMemory
    memory: Any  # the one HostDeviceMemory every open_device_memory() returns here


class TensorRTInProcess:
    """The process's `runtimes.isolation.ChildRunner`, except that TensorRT is probed and its
    first loads are let through here (the double lives only in this process)."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner

    def probe(
        self, names: Iterable[str], libraries: Mapping[str, Sequence[str]] | None = None, root: Path | None = None
    ) -> dict[str, Any]:
        from runtimes import tensorrt_backend

        wanted = list(names)
        found = self._runner.probe([n for n in wanted if n != "tensorrt"], libraries, root)
        return {n: tensorrt_backend.availability() if n == "tensorrt" else found[n] for n in wanted}

    def known(self, names: Iterable[str], root: Path | None = None) -> dict[str, Any] | None:
        """What the runner already found, never for TensorRT: the double is probed here each time."""
        wanted = list(names)
        return None if "tensorrt" in wanted else self._runner.known(wanted, root)

    def remember(self, infos: Mapping[str, Any], cache_file: Path, root: Path | None = None) -> None:
        """All of them, TensorRT's too: `known` never asks the runner about TensorRT, so its answer
        there only names the file that a failed load of the double distrusts."""
        self._runner.remember(infos, cache_file, root)

    def distrust(self, name: str) -> Path | None:
        return self._runner.distrust(name)  # type: ignore[no-any-return]

    def check_load(self, name: str, model: Path, settings_json: str, libraries: Sequence[str] | None = None) -> None:
        if name != "tensorrt":
            self._runner.check_load(name, model, settings_json, libraries)


def forget_tensorrt() -> None:
    for name in [n for n in sys.modules if n == "tensorrt" or n.startswith("tensorrt.")]:
        del sys.modules[name]
