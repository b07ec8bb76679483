"""The runtime selection policy: a pure function, table-tested.

``select_runtimes(board, available, artifacts, preference)`` ranks (runtime, artifact) pairs:

- Jetson or NVIDIA GPU: TensorRT with an ONNX artifact, then ONNX Runtime with its best
  execution provider (TensorRT EP, CUDA EP), then LiteRT.
- ARM CPU (Raspberry Pi, other ARM boards): LiteRT with a .tflite artifact (int8 first), then
  ONNX Runtime on the CPU.
- x86 CPU: ONNX Runtime (OpenVINO EP when present, else CPU), then LiteRT.

An explicit preference keeps only that runtime, and says why when it cannot be used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal, Protocol

from runtimes.base import BackendError, Precision, RuntimeInfo, RuntimeName

#: a configured runtime: one by name, or "auto" (this policy decides)
Preference = Literal["auto", RuntimeName]
ArtifactFormat = Literal["onnx", "tflite"]

_FORMAT_OF: dict[RuntimeName, ArtifactFormat] = {"tensorrt": "onnx", "onnxruntime": "onnx", "litert": "tflite"}


def runtimes_for(artifacts: Sequence[Artifact]) -> tuple[RuntimeName, ...]:
    """The runtimes that can load at least one of `artifacts` (the only ones worth probing)."""
    formats = {a.format for a in artifacts}
    return tuple(name for name, fmt in _FORMAT_OF.items() if fmt in formats)


_ARM_ARCHES = frozenset({"aarch64", "arm64", "armv7l", "armv6l", "armv8l"})
#: ONNX Runtime providers, best first, with the name used in reasons
_ORT_PROVIDER_RANK = (
    ("TensorrtExecutionProvider", "TensorRT EP"),
    ("CUDAExecutionProvider", "CUDA EP"),
    ("OpenVINOExecutionProvider", "OpenVINO EP"),
    ("CPUExecutionProvider", "CPU"),
)


class SelectionError(BackendError):
    """No runtime can run any of the artifacts here; the message says why for each."""


class BoardFacts(Protocol):
    """What the policy needs to know about the device (`agent.hardware.probe.Board` provides it)."""

    @property
    def kind(self) -> str: ...  # "jetson", "raspberry_pi" or "generic"

    @property
    def arch(self) -> str: ...  # platform.machine(): "x86_64", "aarch64", ...

    @property
    def nvidia_gpu(self) -> bool: ...


@dataclass(frozen=True)
class Artifact:
    """One model file a runtime could load."""

    path: str
    format: ArtifactFormat
    precision: Precision = "fp32"

    @classmethod
    def from_path(cls, path: str | PurePath, precision: Precision = "fp32") -> Artifact:
        """An artifact whose format follows the file suffix (.onnx or .tflite)."""
        suffix = PurePath(path).suffix.lower()
        if suffix not in (".onnx", ".tflite"):
            raise SelectionError(f"{path}: unknown model format {suffix or '(no suffix)'!r}; expected .onnx or .tflite")
        return cls(str(path), "onnx" if suffix == ".onnx" else "tflite", precision)


@dataclass(frozen=True)
class Choice:
    """A ranked candidate: run `artifact` with `runtime` on `device`, and why."""

    runtime: RuntimeName
    artifact: Artifact
    device: str
    reason: str


def _board_label(board: BoardFacts) -> str:
    names = {"jetson": "Jetson", "raspberry_pi": "Raspberry Pi"}
    label = names.get(board.kind, "generic")
    gpu = " with an NVIDIA GPU" if board.nvidia_gpu and board.kind != "jetson" else ""
    return f"{label} {board.arch}{gpu}"


def _runtime_order(board: BoardFacts) -> tuple[RuntimeName, ...]:
    if board.kind == "jetson" or board.nvidia_gpu:
        return ("tensorrt", "onnxruntime", "litert")
    if board.arch in _ARM_ARCHES:
        return ("litert", "onnxruntime")
    return ("onnxruntime", "litert")


def _precision_order(board: BoardFacts) -> tuple[Precision, ...]:
    return ("int8", "fp16", "fp32") if board.arch in _ARM_ARCHES else ("fp32", "fp16", "int8")


def _device(runtime: RuntimeName, info: RuntimeInfo) -> str:
    if runtime == "onnxruntime":
        for provider, label in _ORT_PROVIDER_RANK:
            if provider in info.devices:
                return label
        return "CPU"
    if runtime == "tensorrt":
        return "GPU (FP16)"
    return info.devices[0] if info.devices else "CPU"


def select_runtimes(
    board: BoardFacts,
    available: Mapping[RuntimeName, RuntimeInfo],
    artifacts: Sequence[Artifact],
    preference: Preference = "auto",
) -> list[Choice]:
    """Rank the runtimes that can run one of `artifacts` on `board`, best first.

    Raises `SelectionError` with every reason when the list would be empty.
    """
    order = _runtime_order(board) if preference == "auto" else (preference,)
    if preference == "auto" and "litert" not in order:
        order = (*order, "litert")
    precision_rank = {p: i for i, p in enumerate(_precision_order(board))}
    choices: list[Choice] = []
    why_not: list[str] = []
    for rank, runtime in enumerate(order):
        fmt = _FORMAT_OF[runtime]
        usable = sorted((a for a in artifacts if a.format == fmt), key=lambda a: precision_rank[a.precision])
        if not usable:
            why_not.append(f"{runtime}: needs a .{fmt} artifact")
            continue
        info = available.get(runtime)
        if info is None or not info.available:
            why_not.append(f"{runtime}: {info.reason if info else 'not probed'}")
            continue
        artifact = usable[0]
        device = _device(runtime, info)
        if preference != "auto":
            reason = f"runtime {runtime} requested by configuration"
        elif rank == 0:
            reason = f"{_board_label(board)}: {runtime} on {device} is preferred for a .{fmt} artifact"
        else:
            reason = f"{_board_label(board)}: fallback to {runtime} on {device} ({'; '.join(why_not) or 'lower rank'})"
        if len(usable) > 1:
            reason += f", {artifact.precision} artifact preferred"
        choices.append(Choice(runtime, artifact, device, reason))
    if not choices:
        formats = ", ".join(sorted({PurePath(a.path).name for a in artifacts})) or "none"
        raise SelectionError(f"no runtime can run the artifacts ({formats}) here: " + "; ".join(why_not))
    return choices
