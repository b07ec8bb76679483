"""The TensorRT test double (tests/fakes/tensorrt_double), installed for one test.

``trt_double`` puts the double first on ``sys.path`` (so ``import tensorrt`` finds it), gives it
a fresh fake GPU, and makes the device-memory seam (`runtimes.cuda_memory.IMPLEMENTATIONS`)
hand out the double's host memory, so the code under test runs unchanged. Yields a `TrtDouble`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DOUBLE = Path(__file__).resolve().parent / "fakes" / "tensorrt_double"


@dataclass
class TrtDouble:
    trt: ModuleType  # the double's `tensorrt` module
    internals: Any  # its `_double` module: GPU, UNSUPPORTED_OPS, HostDeviceMemory
    memory: Any  # the one HostDeviceMemory every open_device_memory() returns here


def _forget_tensorrt() -> None:
    for name in [n for n in sys.modules if n == "tensorrt" or n.startswith("tensorrt.")]:
        del sys.modules[name]


@pytest.fixture
def trt_double(monkeypatch: pytest.MonkeyPatch) -> Iterator[TrtDouble]:
    from runtimes import cuda_memory

    _forget_tensorrt()
    monkeypatch.syspath_prepend(str(DOUBLE))
    import tensorrt
    from tensorrt import _double

    _double.GPU = _double.FakeGpu()
    memory = _double.HostDeviceMemory()
    _double.device = memory
    _double.builds.clear()
    _double.build_gate, _double.output_offset = None, 0.0
    monkeypatch.setattr(_double, "UNSUPPORTED_OPS", set(_double.UNSUPPORTED_OPS))
    monkeypatch.setattr(cuda_memory, "IMPLEMENTATIONS", (("host double", lambda device: memory),))
    try:
        yield TrtDouble(tensorrt, _double, memory)
    finally:
        _double.device = None
        _forget_tensorrt()
