"""`runtimes.cuda_memory` on a real GPU (skipped without one)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from testkit import DEMO_MODELS, FAKES

from runtimes.cuda_memory import CudaError, CudaPythonMemory, DeviceMemory, open_device_memory

pytestmark = pytest.mark.gpu


DOUBLE = FAKES / "tensorrt_double"


DEMO = DEMO_MODELS / "demo_detector.onnx"


@pytest.fixture(scope="module")
def memory() -> Iterator[CudaPythonMemory]:
    runtime = pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed")
    error, count = runtime.cudaGetDeviceCount()
    if int(error) != 0 or count < 1:
        pytest.skip(f"no CUDA GPU here ({error})")
    gpu = CudaPythonMemory()
    yield gpu
    gpu.close()


def test_gpu_info_and_versions(memory: CudaPythonMemory) -> None:
    info = memory.info()
    runtime, driver = memory.versions()
    print(f"\nGPU: {info.name}, sm {info.compute_capability}, {info.total_memory_mb} MiB")
    print(f"CUDA runtime {runtime}, driver {driver}")
    assert info.name and info.compute_capability >= (5, 0) and info.total_memory_mb > 1024
    assert runtime >= 11000 and driver >= 11000
    assert open_device_memory().library == "cuda-python"


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((1, 3, 640, 640), np.float32), ((1, 84, 8400), np.float16), ((4096,), np.int8), ((16 << 20,), np.uint8)],
)
def test_round_trip_through_device_memory(memory: CudaPythonMemory, shape: tuple[int, ...], dtype: Any) -> None:
    rng = np.random.default_rng(len(shape))
    data = (rng.random(shape) * 100).astype(dtype)
    stream = memory.stream()
    device = memory.alloc(data.nbytes)
    staged, back = memory.pinned(shape, dtype), memory.pinned(shape, dtype)
    try:
        np.copyto(staged, data)
        back.fill(0)
        memory.to_device(device, staged, stream)
        memory.to_host(back, device, stream)
        memory.synchronize(stream)
        assert back.tobytes() == data.tobytes()
    finally:
        memory.free(device)
        memory.free_pinned(staged)
        memory.free_pinned(back)
        memory.close_stream(stream)


def test_copies_are_checked_and_errors_name_the_call(memory: CudaPythonMemory) -> None:
    stream = memory.stream()
    small = memory.alloc(16)
    try:
        with pytest.raises(CudaError, match="32 bytes do not fit a device buffer of 16"):
            memory.to_device(small, np.zeros(8, np.float32), stream)
        with pytest.raises(CudaError, match="not allocated by pinned"):
            memory.free_pinned(np.zeros(4))
        with pytest.raises(CudaError, match=r"cudaMalloc failed: cudaErrorMemoryAllocation"):
            memory.alloc(1 << 50)  # a petabyte
    finally:
        memory.free(small)
        memory.close_stream(stream)


class _GpuAccess:
    """Lets the TensorRT double's engines read and write real device memory: work queued on a
    stream runs once the stream has finished what the backend queued before it."""

    def __init__(self, memory: CudaPythonMemory) -> None:
        import cuda.bindings.runtime as cudart

        self._rt, self._memory = cudart, memory

    def enqueue(self, stream_handle: int, work: Callable[[], None]) -> None:
        (error,) = self._rt.cudaStreamSynchronize(stream_handle)
        assert int(error) == 0, error
        work()

    def read(self, address: int, nbytes: int) -> bytes:
        host = np.empty(nbytes, np.uint8)
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        (error,) = self._rt.cudaMemcpy(host.ctypes.data, address, nbytes, kind)
        assert int(error) == 0, error
        return host.tobytes()

    def write(self, address: int, data: bytes) -> None:
        host = np.frombuffer(data, np.uint8)
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        (error,) = self._rt.cudaMemcpy(address, host.ctypes.data, len(data), kind)
        assert int(error) == 0, error


def test_the_tensorrt_backend_runs_on_real_device_memory(
    memory: CudaPythonMemory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from runtimes import cuda_memory

    for name in [n for n in sys.modules if n == "tensorrt" or n.startswith("tensorrt.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(DOUBLE))
    from tensorrt import _double

    real: DeviceMemory = CudaPythonMemory()
    monkeypatch.setattr(cuda_memory, "IMPLEMENTATIONS", (("cuda-python", lambda device: real),))
    monkeypatch.setattr(_double, "device", _GpuAccess(memory))
    info = real.info()
    monkeypatch.setattr(_double, "GPU", _double.FakeGpu(name=info.name, compute_capability=info.compute_capability))
    from runtimes.ort_backend import OnnxRuntimeBackend
    from runtimes.tensorrt_backend import TensorRTConfig, open_engine
    from runtimes.tensorrt_engines import prepare_engine

    config = TensorRTConfig(engine_cache_dir=tmp_path, precision="fp32")
    prepared = prepare_engine(DEMO, config)
    assert prepared.key.gpu_name == info.name, "the engine key names the real GPU"
    with open_engine(DEMO, config) as runtime, OnnxRuntimeBackend(DEMO) as reference:
        for seed in range(3):
            x = np.random.default_rng(seed).random((1, 3, 320, 320), dtype=np.float32)
            (got,), (want,) = runtime.infer([x]), reference.infer([x])
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        addresses = [t.device.address for t in runtime._tensors]
        assert all(a > 0 for a in addresses)
    for _ in range(3):  # open and close again: nothing leaks on the GPU
        with open_engine(DEMO, config) as runtime:
            runtime.infer([np.zeros((1, 3, 320, 320), np.float32)])
