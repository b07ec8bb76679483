"""GPU memory for the TensorRT backend, behind one small seam with two implementations.

`DeviceMemory` is what the backend needs from CUDA: the GPU's name and compute capability,
device buffers (allocate, free), page-locked ("pinned") host arrays, a stream, copies host to
device and device to host queued on that stream, and waiting for the stream. Two
implementations, tried in this order by `open_device_memory`:

- `CudaPythonMemory`: NVIDIA's cuda-python (`cuda.bindings.runtime`, or the older
  `cuda.cudart` module of cuda-python < 12.6), the CUDA runtime API that TensorRT itself uses;
- `PyCudaMemory`: pycuda (Jetson images often ship it), on the device's primary context, pushed
  for each call so that any thread may use it.

Tests use a host-memory double of the same interface; the cuda-python implementation is run
for real on a GPU by ``tests/runtimes/test_cuda_memory.py`` (marked ``gpu``). No CUDA library is
imported before `open_device_memory` is called.

Thread safety: one `DeviceMemory` may be used from several threads; a stream and the buffers
queued on it belong to one caller at a time (the TensorRT backend serves one call at a time).
"""

from __future__ import annotations

import abc
import contextlib
import ctypes
import importlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from runtimes.base import RuntimeUnavailable


class CudaError(RuntimeError):
    """A CUDA call failed; the message names the call and CUDA's error."""


@dataclass(frozen=True)
class GpuInfo:
    """The GPU the memory lives on: its name, compute capability (major, minor) and memory in MiB."""

    name: str
    compute_capability: tuple[int, int]
    total_memory_mb: int


@dataclass(frozen=True)
class DeviceBuffer:
    """`nbytes` of device memory at `address` (a CUDA device pointer)."""

    address: int
    nbytes: int


@dataclass(frozen=True)
class Stream:
    """A CUDA stream: `handle` is what TensorRT's ``execute_async_v3`` takes; `native` is the
    library's own object."""

    handle: int
    native: Any


class DeviceMemory(abc.ABC):
    """Device memory, pinned host memory and streams of one GPU (see the module docstring)."""

    #: the library behind it: "cuda-python" or "pycuda"
    library: str = ""

    @abc.abstractmethod
    def info(self) -> GpuInfo:
        """The GPU's name, compute capability and memory."""

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> DeviceBuffer:
        """Allocate `nbytes` (at least 1) of device memory; raises `CudaError` when out of memory."""

    @abc.abstractmethod
    def free(self, buffer: DeviceBuffer) -> None:
        """Release a buffer from `alloc`."""

    @abc.abstractmethod
    def pinned(self, shape: Sequence[int], dtype: npt.DTypeLike) -> npt.NDArray[Any]:
        """A page-locked host array (copies from and to it can overlap with the GPU's work)."""

    @abc.abstractmethod
    def free_pinned(self, array: npt.NDArray[Any]) -> None:
        """Release an array from `pinned` (the array must not be used afterwards)."""

    @abc.abstractmethod
    def stream(self) -> Stream:
        """A new stream."""

    @abc.abstractmethod
    def close_stream(self, stream: Stream) -> None:
        """Destroy a stream (after its work is done)."""

    @abc.abstractmethod
    def to_device(self, dst: DeviceBuffer, src: npt.NDArray[Any], stream: Stream) -> None:
        """Queue a copy of the C-contiguous host array `src` into `dst` on `stream`."""

    @abc.abstractmethod
    def to_host(self, dst: npt.NDArray[Any], src: DeviceBuffer, stream: Stream) -> None:
        """Queue a copy of the first ``dst.nbytes`` of `src` into the C-contiguous `dst` on `stream`."""

    @abc.abstractmethod
    def synchronize(self, stream: Stream) -> None:
        """Wait until everything queued on `stream` is done."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the implementation holds itself (buffers are freed by their owners)."""


def check_copy(nbytes: int, buffer: DeviceBuffer, what: str) -> None:
    """Raise `CudaError` when a copy of `nbytes` does not fit `buffer`."""
    if nbytes > buffer.nbytes:
        raise CudaError(f"{what}: {nbytes} bytes do not fit a device buffer of {buffer.nbytes}")


def _contiguous(array: npt.NDArray[Any], what: str) -> None:
    if not array.flags.c_contiguous:
        raise CudaError(f"{what}: the host array must be C-contiguous")


def _import_first(names: Sequence[str]) -> Any:
    errors = []
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise ImportError("; ".join(errors))


class CudaPythonMemory(DeviceMemory):
    """The CUDA runtime API through cuda-python (``pip install cuda-python``; JetPack's wheel)."""

    library = "cuda-python"

    def __init__(self, device: int = 0) -> None:
        try:
            self._rt = _import_first(("cuda.bindings.runtime", "cuda.cudart"))
        except ImportError as exc:
            raise RuntimeUnavailable(f"cuda-python is not installed ({exc})") from exc
        self._host_kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._device_kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._pinned: dict[int, int] = {}  # id(array) -> host pointer
        self._call("cudaSetDevice", device)
        self._device = device

    def _call(self, name: str, *args: Any) -> Any:
        """Call ``cudart.<name>(*args)``; return its result (None, one value or a tuple)."""
        result = getattr(self._rt, name)(*args)
        error, values = result[0], result[1:]
        if int(error) != 0:
            _, text = self._rt.cudaGetErrorString(error)
            message = text.decode() if isinstance(text, bytes) else str(text)
            raise CudaError(f"{name} failed: {getattr(error, 'name', error)} ({message})")
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    def info(self) -> GpuInfo:
        props = self._call("cudaGetDeviceProperties", self._device)
        name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
        return GpuInfo(
            name.rstrip("\x00").strip(), (int(props.major), int(props.minor)), int(props.totalGlobalMem) >> 20
        )

    def alloc(self, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(int(self._call("cudaMalloc", max(1, nbytes))), max(1, nbytes))

    def free(self, buffer: DeviceBuffer) -> None:
        self._call("cudaFree", buffer.address)

    def pinned(self, shape: Sequence[int], dtype: npt.DTypeLike) -> npt.NDArray[Any]:
        dt = np.dtype(dtype)
        nbytes = max(1, math.prod(shape) * dt.itemsize)
        pointer = int(self._call("cudaMallocHost", nbytes))
        raw: npt.NDArray[Any] = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(pointer))
        array = raw[: math.prod(shape) * dt.itemsize].view(dt).reshape(tuple(shape))
        self._pinned[id(array)] = pointer
        return array

    def free_pinned(self, array: npt.NDArray[Any]) -> None:
        pointer = self._pinned.pop(id(array), None)
        if pointer is None:
            raise CudaError("free_pinned: this array was not allocated by pinned()")
        self._call("cudaFreeHost", pointer)

    def stream(self) -> Stream:
        native = self._call("cudaStreamCreate")
        return Stream(int(native), native)

    def close_stream(self, stream: Stream) -> None:
        self._call("cudaStreamDestroy", stream.native)

    def to_device(self, dst: DeviceBuffer, src: npt.NDArray[Any], stream: Stream) -> None:
        _contiguous(src, "to_device")
        check_copy(src.nbytes, dst, "to_device")
        self._call("cudaMemcpyAsync", dst.address, src.ctypes.data, src.nbytes, self._host_kind, stream.native)

    def to_host(self, dst: npt.NDArray[Any], src: DeviceBuffer, stream: Stream) -> None:
        _contiguous(dst, "to_host")
        check_copy(dst.nbytes, src, "to_host")
        self._call("cudaMemcpyAsync", dst.ctypes.data, src.address, dst.nbytes, self._device_kind, stream.native)

    def synchronize(self, stream: Stream) -> None:
        self._call("cudaStreamSynchronize", stream.native)

    def versions(self) -> tuple[int, int]:
        """(CUDA runtime, driver) versions as CUDA numbers them, e.g. (13030, 13000)."""
        return int(self._call("cudaRuntimeGetVersion")), int(self._call("cudaDriverGetVersion"))


class PyCudaMemory(DeviceMemory):
    """CUDA through pycuda, on the device's primary context (the one TensorRT's runtime API uses),
    made current around each call so that it works from any thread."""

    library = "pycuda"

    def __init__(self, device: int = 0) -> None:
        try:
            self._cuda = importlib.import_module("pycuda.driver")
        except ImportError as exc:
            raise RuntimeUnavailable(f"pycuda is not installed ({exc})") from exc
        try:
            self._cuda.init()
            self._dev = self._cuda.Device(device)
            self._context = self._dev.retain_primary_context()
        except self._cuda.Error as exc:
            raise CudaError(f"pycuda cannot open GPU {device}: {exc}") from exc
        self._allocations: dict[int, Any] = {}  # address -> DeviceAllocation

    @contextlib.contextmanager
    def _current(self, what: str) -> Iterator[None]:
        self._context.push()
        try:
            yield
        except self._cuda.Error as exc:
            raise CudaError(f"{what} failed: {exc}") from exc
        finally:
            self._cuda.Context.pop()

    def _run(self, what: str, call: Callable[[], Any]) -> Any:
        with self._current(what):
            return call()

    def info(self) -> GpuInfo:
        major, minor = self._dev.compute_capability()
        return GpuInfo(str(self._dev.name()), (int(major), int(minor)), int(self._dev.total_memory()) >> 20)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        allocation = self._run("mem_alloc", lambda: self._cuda.mem_alloc(max(1, nbytes)))
        self._allocations[int(allocation)] = allocation
        return DeviceBuffer(int(allocation), max(1, nbytes))

    def free(self, buffer: DeviceBuffer) -> None:
        allocation = self._allocations.pop(buffer.address, None)
        if allocation is not None:
            self._run("free", allocation.free)

    def pinned(self, shape: Sequence[int], dtype: npt.DTypeLike) -> npt.NDArray[Any]:
        array: npt.NDArray[Any] = self._run(
            "pagelocked_empty", lambda: self._cuda.pagelocked_empty(tuple(shape), dtype)
        )
        return array

    def free_pinned(self, array: npt.NDArray[Any]) -> None:
        base = array.base
        if base is not None and hasattr(base, "free"):
            self._run("free pinned", base.free)

    def stream(self) -> Stream:
        native = self._run("Stream", self._cuda.Stream)
        return Stream(int(native.handle), native)

    def close_stream(self, stream: Stream) -> None:
        """pycuda destroys a stream when its object is collected."""

    def to_device(self, dst: DeviceBuffer, src: npt.NDArray[Any], stream: Stream) -> None:
        _contiguous(src, "to_device")
        check_copy(src.nbytes, dst, "to_device")
        self._run("memcpy_htod_async", lambda: self._cuda.memcpy_htod_async(dst.address, src, stream.native))

    def to_host(self, dst: npt.NDArray[Any], src: DeviceBuffer, stream: Stream) -> None:
        _contiguous(dst, "to_host")
        check_copy(dst.nbytes, src, "to_host")
        self._run("memcpy_dtoh_async", lambda: self._cuda.memcpy_dtoh_async(dst, src.address, stream.native))

    def synchronize(self, stream: Stream) -> None:
        self._run("Stream.synchronize", stream.native.synchronize)

    def close(self) -> None:
        self._context.detach()


#: the implementations `open_device_memory` tries, in order: (library, constructor taking the GPU index)
IMPLEMENTATIONS: tuple[tuple[str, Callable[[int], DeviceMemory]], ...] = (
    (CudaPythonMemory.library, CudaPythonMemory),
    (PyCudaMemory.library, PyCudaMemory),
)


def open_device_memory(device: int = 0) -> DeviceMemory:
    """The first implementation whose library imports (cuda-python, then pycuda); raises
    `RuntimeUnavailable` naming why each failed."""
    reasons = []
    for library, implementation in IMPLEMENTATIONS:
        try:
            return implementation(device)
        except (RuntimeUnavailable, CudaError) as exc:
            reasons.append(f"{library}: {exc}")
    raise RuntimeUnavailable("no CUDA library for device memory: " + "; ".join(reasons))
