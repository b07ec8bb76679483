"""The runtime selection policy: a pure function of its arguments, table-tested.

``select_runtimes(board, available, artifacts, preference)`` ranks (runtime, artifact) pairs by
the backends' entries in the registry (`runtimes.base.Backend`: the formats each loads, its rank
on the board's class, its device label). With the in-tree backends:

- Jetson or NVIDIA GPU: TensorRT with an ONNX artifact, then ONNX Runtime with its best
  execution provider (TensorRT EP, CUDA EP), then LiteRT.
- ARM CPU (Raspberry Pi, other ARM boards): Hailo with a .hef artifact (where the probe finds
  a Hailo chip and HailoRT), then LiteRT with a .tflite artifact (int8 first), then ONNX Runtime
  on the CPU.
- x86 CPU: ONNX Runtime (OpenVINO EP when present, else CPU), then LiteRT.

A registered plugin takes its place in that order by its own rank. An explicit preference keeps
only that runtime, and says why when it cannot be used.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Annotated, Any, Protocol

from pydantic import AfterValidator, WithJsonSchema

from runtimes.base import ArtifactFormat, Backend, BackendError, BoardClass, Precision, RuntimeInfo, RuntimeName
from runtimes.hailo_device import COMPATIBLE, hef_family, runs_on_family
from runtimes.registry import BACKENDS, RUNTIME_NAMES, load_plugins

#: what ``runtime:`` and ``--runtime`` take: "auto" (this policy decides), or an in-tree backend
#: by name; a plugin's name too once plugins are loaded (`RuntimeChoices`, `_known_preference`)
PREFERENCES: tuple[str, ...] = ("auto", *RUNTIME_NAMES)


class RuntimeChoices:
    """The ``--runtime`` choices of a command line: "auto" and every backend. Listing them
    (``--help``) names those known without importing a plugin; checking a name that is not
    in-tree loads the plugins first (`runtimes.registry.load_plugins`), when the command runs."""

    def __iter__(self) -> Iterator[str]:
        return iter(("auto", *BACKENDS))

    def __contains__(self, value: object) -> bool:
        if value == "auto" or value in BACKENDS:
            return True
        load_plugins()
        return value in BACKENDS


def _known_preference(value: str) -> str:
    if value != "auto" and value not in BACKENDS:  # the table as loaded: validation does no I/O
        raise ValueError(f"unknown runtime {value!r}: expected {', '.join(('auto', *BACKENDS))}")
    return value


#: a configured runtime, "auto" or a backend of the table (its plugins loaded before validation)
Preference = Annotated[
    str, AfterValidator(_known_preference), WithJsonSchema({"enum": list(PREFERENCES), "type": "string"})
]


def runtimes_for(
    artifacts: Sequence[Artifact], backends: Mapping[RuntimeName, Backend[Any]] | None = None
) -> tuple[RuntimeName, ...]:
    """The runtimes that can load at least one of `artifacts` (the only ones worth probing);
    default: every backend, the plugins loaded first (a backend is needed)."""
    if backends is None:
        load_plugins()
        backends = BACKENDS
    formats = {a.format for a in artifacts}
    return tuple(name for name, entry in backends.items() if formats & set(entry.formats))


def known_formats(backends: Mapping[RuntimeName, Backend[Any]] = BACKENDS) -> tuple[ArtifactFormat, ...]:
    """The artifact formats some backend loads, in the table's order."""
    return tuple(dict.fromkeys(f for entry in backends.values() for f in entry.formats))


_ARM_ARCHES = frozenset({"aarch64", "arm64", "armv7l", "armv6l", "armv8l"})


class SelectionError(BackendError):
    """No runtime can run any of the artifacts here; the message says why for each."""


class BoardFacts(Protocol):
    """What the policy needs to know about the device (`agent.hardware.board.Board` provides it)."""

    @property
    def kind(self) -> str: ...  # "jetson", "raspberry_pi" or "generic"

    @property
    def arch(self) -> str: ...  # platform.machine(): "x86_64", "aarch64", ...

    @property
    def nvidia_gpu(self) -> bool: ...

    @property
    def soc(self) -> str | None: ...  # a Rockchip NPU's RKNN platform ("rk3588"), else None

    @property
    def hailo(self) -> str | None: ...  # the Hailo chip found ("Hailo-8/8L", "Hailo-10H"), else None


#: file suffixes whose format is not the suffix itself: OpenVINO's IR is ``model.xml`` (its
#: weights ``model.bin`` beside it), format ``openvino``; a compiled TVM module is ``model.so``
#: (a converted RKNN model is ``model.rknn``, format ``rknn``, its suffix)
SUFFIX_FORMATS: Mapping[str, ArtifactFormat] = {".xml": "openvino", ".so": "tvm"}


@dataclass(frozen=True)
class Artifact:
    """One model file a runtime could load; `format` is its suffix without the dot (``.xml``:
    ``openvino``, `SUFFIX_FORMATS`); `arch`, the CPU architecture a compiled artifact was built
    for (a TVM module: ``aarch64``; None: any board); `soc`, the SoC an RKNN model was converted
    for (``rk3588``; None: any board); `chip`, the Hailo architecture a HEF was compiled for
    (``hailo8l``; None: any chip)."""

    path: str
    format: ArtifactFormat
    precision: Precision = "fp32"
    arch: str | None = None
    soc: str | None = None
    chip: str | None = None

    def runs_on(self, board: BoardFacts) -> bool:
        """Whether `board` is the CPU, SoC and Hailo chip this artifact was built for (any board
        where it names none; a HEF on a board without a Hailo chip is left to its backend, which
        says there is none)."""
        return (
            (self.arch is None or self.arch == board.arch)
            and (self.soc is None or self.soc == board.soc)
            and (self.chip is None or runs_on_family(self.chip, board.hailo))
        )

    def built_for(self) -> str:
        """What it was built for, in words (``rk3588 aarch64``, ``hailo8l (Hailo-8/Hailo-8L)``)."""
        chip = self.chip
        if chip is not None and chip in COMPATIBLE:
            chip = f"{chip} ({hef_family(chip)})"
        return " ".join(t for t in (chip, self.soc, self.arch) if t)

    @classmethod
    def from_path(
        cls, path: str | PurePath, precision: Precision = "fp32", formats: Iterable[ArtifactFormat] | None = None
    ) -> Artifact:
        """An artifact whose format follows the file suffix: one of `formats` (default: those a
        registered backend loads, `known_formats`, a plugin's too: loaded for a format not in-tree)."""
        known = tuple(known_formats() if formats is None else formats)
        suffix = PurePath(path).suffix.lower()
        named = SUFFIX_FORMATS.get(suffix, suffix[1:])
        if named not in known and formats is None:
            load_plugins()
            known = known_formats()
        if named not in known:
            expected = " or ".join(next((s for s, f in SUFFIX_FORMATS.items() if f == k), f".{k}") for k in known)
            raise SelectionError(f"{path}: unknown model format {suffix or '(no suffix)'!r}; expected {expected}")
        return cls(str(path), named, precision)


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


def board_class(board: BoardFacts) -> BoardClass:
    """Which of the backends' ranks applies on `board` (`runtimes.base.BoardClass`)."""
    if board.kind == "jetson" or board.nvidia_gpu:
        return "nvidia"
    return "arm" if board.arch in _ARM_ARCHES else "x86"


def _runtime_order(board: BoardFacts, backends: Mapping[RuntimeName, Backend[Any]]) -> tuple[RuntimeName, ...]:
    """The backends ranked on `board`'s class, by rank (ties in the table's order); one bound to
    SoCs (`Backend.socs`: rknn) only on a board with one of them."""
    cls = board_class(board)
    ranked = [
        name for name, entry in backends.items() if cls in entry.rank and (not entry.socs or board.soc in entry.socs)
    ]
    return tuple(sorted(ranked, key=lambda name: backends[name].rank[cls]))


def runtime_order(
    board: BoardFacts, preference: Preference = "auto", backends: Mapping[RuntimeName, Backend[Any]] = BACKENDS
) -> tuple[RuntimeName, ...]:
    """The runtimes `select_runtimes` tries on `board`, in its order: the preferred one alone,
    or for ``auto`` those ranked on the board's class, by rank."""
    return _runtime_order(board, backends) if preference == "auto" else (preference,)


def _precision_order(board: BoardFacts) -> tuple[Precision, ...]:
    return ("int8", "fp16", "fp32") if board.arch in _ARM_ARCHES else ("fp32", "fp16", "int8")


def select_runtimes(
    board: BoardFacts,
    available: Mapping[RuntimeName, RuntimeInfo],
    artifacts: Sequence[Artifact],
    preference: Preference = "auto",
    backends: Mapping[RuntimeName, Backend[Any]] = BACKENDS,
) -> list[Choice]:
    """Rank the runtimes of `backends` (default: the registry's) that can run one of `artifacts`
    on `board`, best first.

    Raises `SelectionError` with every reason when the list would be empty.
    """
    if preference != "auto" and preference not in backends:
        raise SelectionError(f"unknown runtime {preference!r}; known: {', '.join(backends)}")
    order = _runtime_order(board, backends) if preference == "auto" else (preference,)
    precision_rank = {p: i for i, p in enumerate(_precision_order(board))}
    choices: list[Choice] = []
    why_not: list[str] = []
    passed_over: list[str] = []  # backends that had an artifact but cannot run it: a fallback's reason
    for runtime in order:
        entry = backends[runtime]
        loadable = [a for a in artifacts if a.format in entry.formats]
        usable = sorted(
            (a for a in loadable if a.runs_on(board)),
            key=lambda a: (precision_rank[a.precision], entry.formats.index(a.format)),
        )
        if not usable and loadable:
            built = ", ".join(f"{PurePath(a.path).name} for {a.built_for()}" for a in loadable)
            here = " ".join(t for t in (board.hailo, board.soc, board.arch) if t)
            why_not.append(f"{runtime}: TARGET_MISMATCH: {built}, this board is {here}")
            passed_over.append(why_not[-1])
            continue
        if not usable:
            # no artifact of its formats: not a fallback from it (a Pi without a .hef is not
            # "falling back" from Hailo), only a reason when nothing can run
            why_not.append(f"{runtime}: needs a {' or '.join(f'.{f}' for f in entry.formats)} artifact")
            continue
        info = available.get(runtime)
        if info is None or not info.available:
            why_not.append(f"{runtime}: {info.reason if info else 'not probed'}")
            passed_over.append(why_not[-1])
            continue
        artifact = usable[0]
        device = entry.device_label(info)
        fmt = artifact.format
        if preference != "auto":
            reason = f"runtime {runtime} requested by configuration"
        elif not passed_over and not choices:
            reason = f"{_board_label(board)}: {runtime} on {device} is preferred for a .{fmt} artifact"
        else:
            reason = (
                f"{_board_label(board)}: fallback to {runtime} on {device} ({'; '.join(passed_over) or 'lower rank'})"
            )
        if len(usable) > 1:
            reason += f", {artifact.precision} artifact preferred"
        choices.append(Choice(runtime, artifact, device, reason))
    if not choices:
        formats = ", ".join(sorted({PurePath(a.path).name for a in artifacts})) or "none"
        raise SelectionError(f"no runtime can run the artifacts ({formats}) here: " + "; ".join(why_not))
    return choices
