"""Internals of the TensorRT test double: the fake GPU, its memory, and how an engine computes.

The double stands in for TensorRT where it cannot be installed. Its "GPU" is `GPU` (name,
compute capability, fast FP16 / INT8); its device memory is whatever `device` is set to: the
host-memory `HostDeviceMemory` below (an implementation of `runtimes.cuda_memory.DeviceMemory`
whose copies are queued per stream and run at `synchronize`, as CUDA's are), or on a GPU
machine an adapter over real CUDA memory (tests/runtimes/test_cuda_memory.py). An engine is the ONNX
model plus a JSON header; executing it runs the model with ONNX Runtime on the CPU, reading its
inputs from and writing its outputs to device memory, in stream order. FP16 engines round
inputs and outputs through float16, so parity checks see FP16-sized errors.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtimes.cuda_memory import DeviceBuffer, DeviceMemory, GpuInfo, Stream, check_copy

MAGIC = b"FAKETRT1"
VERSION = "10.13.0.35"


@dataclass
class FakeGpu:
    name: str = "Orin (test double)"
    compute_capability: tuple[int, int] = (8, 7)
    fast_fp16: bool = True
    fast_int8: bool = True
    total_memory_mb: int = 8192


GPU = FakeGpu()
#: ONNX operators the double's parser refuses, as TensorRT 10's ONNX parser does
UNSUPPORTED_OPS = {"ConvInteger", "DynamicQuantizeLinear", "MatMulInteger"}


class DeviceAccess:
    """What an executing engine needs from device memory."""

    def enqueue(self, stream_handle: int, work: Callable[[], None]) -> None:
        raise NotImplementedError

    def read(self, address: int, nbytes: int) -> bytes:
        raise NotImplementedError

    def write(self, address: int, data: bytes) -> None:
        raise NotImplementedError


@dataclass
class _Allocation:
    data: bytearray


class HostDeviceMemory(DeviceMemory, DeviceAccess):
    """Test double of `DeviceMemory`: "device" buffers are host bytearrays at made-up addresses,
    copies and engine work are queued per stream and run in order at `synchronize` (so a caller
    that reads outputs before synchronizing reads stale bytes, as on a GPU). `log` records each
    call; `live` counts what is still allocated."""

    library = "host double"

    def __init__(self) -> None:
        self._lock = threading.RLock()  # the build thread and inference threads share the "GPU"
        self._streams = 0
        self._next = 0x7F00_0000_0000
        self._allocations: dict[int, _Allocation] = {}
        self._queues: dict[int, list[Callable[[], None]]] = {}
        self._pinned: set[int] = set()
        self.log: list[str] = []
        self.closed = False

    @property
    def live(self) -> dict[str, int]:
        return {"buffers": len(self._allocations), "pinned": len(self._pinned), "streams": len(self._queues)}

    def info(self) -> GpuInfo:
        return GpuInfo(GPU.name, GPU.compute_capability, GPU.total_memory_mb)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        with self._lock:
            address, self._next = self._next, self._next + ((max(1, nbytes) + 255) // 256) * 256
            self._allocations[address] = _Allocation(bytearray(max(1, nbytes)))
        self.log.append(f"alloc {nbytes}")
        return DeviceBuffer(address, max(1, nbytes))

    def free(self, buffer: DeviceBuffer) -> None:
        with self._lock:
            found = self._allocations.pop(buffer.address, None)
        if found is None:
            raise AssertionError(f"free of {buffer.address:#x}: not allocated (double free?)")
        self.log.append("free")

    def pinned(self, shape: Any, dtype: Any) -> Any:
        array = np.empty(tuple(shape), dtype)
        self._pinned.add(id(array))
        return array

    def free_pinned(self, array: Any) -> None:
        self._pinned.remove(id(array))

    def stream(self) -> Stream:
        with self._lock:
            self._streams += 1
            handle = 1000 + self._streams
            self._queues[handle] = []
        self.log.append(f"stream {handle}")
        return Stream(handle, handle)

    def close_stream(self, stream: Stream) -> None:
        if self._queues.pop(stream.handle, None):
            raise AssertionError("stream destroyed with work still queued")

    def _find(self, address: int, nbytes: int) -> bytearray:
        with self._lock:
            allocations = list(self._allocations.items())
        for base, allocation in allocations:
            if base <= address and address + nbytes <= base + len(allocation.data):
                return allocation.data
        raise AssertionError(f"device access of {nbytes} bytes at {address:#x} outside every allocation")

    def to_device(self, dst: DeviceBuffer, src: Any, stream: Stream) -> None:
        check_copy(src.nbytes, dst, "to_device")

        def copy() -> None:  # as on a GPU, the host buffer is read when the stream gets here
            self._find(dst.address, src.nbytes)[: src.nbytes] = src.tobytes()

        self.enqueue(stream.handle, copy)
        self.log.append(f"to_device {src.nbytes}")

    def to_host(self, dst: Any, src: DeviceBuffer, stream: Stream) -> None:
        check_copy(dst.nbytes, src, "to_host")

        def copy() -> None:
            data = bytes(self._find(src.address, dst.nbytes)[: dst.nbytes])
            np.copyto(dst, np.frombuffer(data, dtype=dst.dtype).reshape(dst.shape))

        self.enqueue(stream.handle, copy)
        self.log.append(f"to_host {dst.nbytes}")

    def synchronize(self, stream: Stream) -> None:
        queue = self._queues[stream.handle]
        while queue:
            queue.pop(0)()
        self.log.append("synchronize")

    def close(self) -> None:
        self.closed = True

    # DeviceAccess, for the double's engines
    def enqueue(self, stream_handle: int, work: Callable[[], None]) -> None:
        if stream_handle not in self._queues:
            raise AssertionError(f"stream handle {stream_handle} is not a live stream")
        self._queues[stream_handle].append(work)

    def read(self, address: int, nbytes: int) -> bytes:
        return bytes(self._find(address, nbytes)[:nbytes])

    def write(self, address: int, data: bytes) -> None:
        self._find(address, len(data))[: len(data)] = data


#: the device memory engines execute against (tests set it; None: no GPU)
device: DeviceAccess | None = None
#: what each build was asked for: flags, workspace limit, profile, calibration, timing cache
builds: list[dict[str, Any]] = []
#: set: builds wait for it before they finish (a real build takes minutes on a Jetson)
build_gate: threading.Event | None = None
#: added to every float output (an engine whose numbers are off: the parity check must catch it)
output_offset = 0.0


@dataclass
class EngineImage:
    """What the double serializes: the ONNX model and how it was built."""

    onnx: bytes
    precision: str
    profile: dict[str, list[list[int]]]
    tensors: list[dict[str, Any]]  # name, mode ("INPUT"/"OUTPUT"), shape (-1 dynamic), dtype name
    gpu: str
    compute_capability: list[int]
    version: str = VERSION
    calibrated: bool = False
    notes: list[str] = field(default_factory=list)
    host_code: bool = False  # a plan with executable host code (a lean runtime, plugins) in it

    def serialize(self) -> bytes:
        """MAGIC, then TensorRT's version at bytes 24-26 (major, minor, patch) as a real plan
        carries it since TensorRT 8.6 (NVIDIA/TensorRT#3073), then the JSON header and the ONNX model."""
        header = json.dumps({k: v for k, v in self.__dict__.items() if k != "onnx"}).encode()
        major, minor, patch = (int(part) for part in self.version.split(".")[:3])
        prefix = MAGIC + bytes(16) + bytes([major, minor, patch, 0])
        return prefix + len(header).to_bytes(4, "little") + header + self.onnx

    @classmethod
    def parse(cls, data: bytes) -> EngineImage:
        if not data.startswith(MAGIC):
            raise ValueError("not an engine plan")
        size = int.from_bytes(data[28:32], "little")
        header = json.loads(data[32 : 32 + size])
        onnx = data[32 + size :]
        if not onnx:
            raise ValueError("truncated engine plan")
        return cls(onnx=onnx, **header)


class Executor:
    """Runs an engine image's model with ONNX Runtime (one session per engine)."""

    def __init__(self, image: EngineImage) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        self.image = image
        self.session = onnxruntime.InferenceSession(image.onnx, options, providers=["CPUExecutionProvider"])
        self._shapes: dict[tuple[Any, ...], list[tuple[int, ...]]] = {}

    def output_shapes(self, inputs: dict[str, tuple[int, ...]]) -> list[tuple[int, ...]]:
        key = tuple(sorted(inputs.items()))
        if key not in self._shapes:
            feed = {i.name: np.zeros(inputs[i.name], _numpy(i.type)) for i in self.session.get_inputs()}
            self._shapes[key] = [o.shape for o in self.session.run(None, feed)]
        return self._shapes[key]

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        fp16 = self.image.precision == "fp16" or self.image.calibrated
        if fp16:
            feed = {k: v.astype(np.float16).astype(v.dtype) if v.dtype == np.float32 else v for k, v in feed.items()}
        outputs = self.session.run(None, feed)
        outputs = [o + np.asarray(output_offset, o.dtype) if o.dtype.kind == "f" else o for o in outputs]
        if fp16:
            outputs = [o.astype(np.float16).astype(o.dtype) if o.dtype == np.float32 else o for o in outputs]
        return outputs


def _numpy(onnx_type: str) -> Any:
    return {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}.get(
        onnx_type, np.float32
    )


def volume(shape: Any) -> int:
    return math.prod(int(d) for d in shape)
