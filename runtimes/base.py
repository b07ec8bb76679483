"""The one interface every inference backend implements, and the entry that describes a backend.

A `Runtime` is built from one model artifact. It describes its inputs and outputs as
`TensorSpec`s, carries the model's metadata, warms up when built, and `infer()` returns the
model's raw outputs. Backends never decode detections: that is `pipelines`' job.

A `Backend` is one backend's registry entry (`runtimes.registry.BACKENDS`): its name, its
settings model (a `BackendConfig`, one section of agent.yaml's ``runtimes:``), the artifact
formats it loads, where the selection policy ranks it on each class of board, how it names its
device, its native library's modules, how to probe and load it; what autotune tries of it on an
artifact (`TuneCandidate`s) and how a bundle's hints and autotune's choice change its settings;
the caches it keeps on disk (`Cache`), pruned with the bundle store's versions. Everything else
(config sections, ``--runtime`` choices, selection, the check processes, the loader, autotune,
cache pruning) is derived from it, for the in-tree backends and for third-party ones registered
through the ``edge_agent.runtimes`` entry point group alike. This module imports no backend library.
"""

from __future__ import annotations

import abc
import ctypes
import importlib
import os
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, Generic, Literal, TypeVar, get_args

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

Layout = Literal["NCHW", "NHWC"]
#: a backend's registry key (``"onnxruntime"``): its ``runtimes:`` section, a ``runtime:``
#: preference, a ``--runtime`` choice; `runtimes.registry.RUNTIME_NAMES` holds those known here
RuntimeName = str
#: an artifact's format: its file suffix without the dot (``"onnx"``, ``"tflite"``)
ArtifactFormat = str
#: numeric precision of a model's weights (or a TensorRT engine)
Precision = Literal["fp32", "fp16", "int8"]
#: the classes of board the selection policy ranks backends for (`runtimes.selection.board_class`):
#: a Jetson or any board with an NVIDIA GPU; another ARM CPU (Raspberry Pi, RK3588, ...); any
#: other CPU (x86_64 in practice)
BoardClass = Literal["nvidia", "arm", "x86"]
BOARD_CLASSES: tuple[BoardClass, ...] = get_args(BoardClass)


class BackendError(Exception):
    """Root of every error raised by `runtimes`."""


class RuntimeUnavailable(BackendError):
    """The backend's library is not installed or cannot run on this machine."""


class ModelLoadError(BackendError):
    """The artifact is missing, unreadable, not a model, or the backend refused it."""


class NotAModelError(ModelLoadError):
    """The file is not a model of the backend's format at all (junk, truncated, wrong type)."""


class InferenceError(BackendError):
    """The backend failed while running the model, or was given wrong inputs."""


@dataclass(frozen=True)
class Quantization:
    """Affine quantization of a tensor: ``real = (q - zero_point) * scale``."""

    scale: float
    zero_point: int


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and element type of one model input or output.

    `shape` holds ``None`` for dynamic axes (batch, height, width of a dynamic export).
    `layout` is set for 4-D image inputs only.
    """

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype[Any]
    layout: Layout | None = None
    quantization: Quantization | None = None

    @property
    def is_quantized(self) -> bool:
        return self.quantization is not None and np.issubdtype(self.dtype, np.integer)

    @property
    def image_hw(self) -> tuple[int | None, int | None]:
        """(height, width) of a 4-D image input in pixels; ``None`` where dynamic."""
        if len(self.shape) != 4 or self.layout is None:
            raise ValueError(f"input {self.name!r} with shape {self.shape} is not an image tensor")
        if self.layout == "NCHW":
            return self.shape[2], self.shape[3]
        return self.shape[1], self.shape[2]


@dataclass(frozen=True)
class ModelMetadata:
    """What a model file says about itself (Ultralytics exports carry all of these).

    `names` maps class id to label; `imgsz` is (height, width) in pixels; `stride` is the
    largest feature stride in pixels. `end2end` is true when the exporter says the output is
    final detections (Ultralytics ``end2end``, or ``args`` with ``nms``: YOLOv10, YOLO26,
    ``nms=True`` exports). `task` is Ultralytics' (``detect``, ``segment``, ``pose``, ``obb``,
    ``classify``, ...); `kpt_shape` a pose model's (keypoints, values per keypoint: 2 or 3).
    """

    names: dict[int, str] | None = None
    imgsz: tuple[int, int] | None = None
    stride: int | None = None
    task: str | None = None
    description: str | None = None
    raw: dict[str, str] = field(default_factory=dict)
    end2end: bool = False
    kpt_shape: tuple[int, int] | None = None


@dataclass(frozen=True)
class RuntimeInfo:
    """Whether a backend can run here: its library version and devices (ONNX Runtime execution
    providers, LiteRT delegates), or the reason it cannot. `crashed` says how the library killed
    the process that probed it (``"SIGSEGV"``, ``"exit status 1"``; `runtimes.isolation`)."""

    name: str
    available: bool
    version: str | None = None
    devices: tuple[str, ...] = ()
    reason: str | None = None
    crashed: str | None = None


def guess_layout(shape: Sequence[int | None]) -> Layout | None:
    """Return the layout of a 4-D image tensor shape, or ``None`` when it is not one.

    Channels are the axis of size 1, 3 or 4 at position 1 (NCHW) or 3 (NHWC).
    """
    if len(shape) != 4:
        return None
    if shape[1] in (1, 3, 4) and shape[3] not in (1, 3, 4):
        return "NCHW"
    if shape[3] in (1, 3, 4):
        return "NHWC"
    if shape[1] in (1, 3, 4):
        return "NCHW"
    return None


def dequantize(array: npt.NDArray[Any], spec: TensorSpec) -> npt.NDArray[Any]:
    """Return `array` as float32, undoing `spec`'s quantization when it has one."""
    if spec.is_quantized and spec.quantization is not None:
        q = spec.quantization
        result: npt.NDArray[Any] = (array.astype(np.float32) - np.float32(q.zero_point)) * np.float32(q.scale)
        return result
    return array.astype(np.float32, copy=False)


class Runtime(abc.ABC):
    """A loaded model, ready to run. Use as a context manager to release it."""

    #: registry key of the backend, e.g. ``"onnxruntime"``
    name: str = ""
    #: whether `infer` may be called from several threads at once (one model in memory serving
    #: several frames in flight); a backend that keeps per-call state (an interpreter, an
    #: execution context) leaves this False
    concurrent: bool = False
    #: the model's inputs and outputs in its own order, and what the file says about itself;
    #: a backend sets all three when it loads the model
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    metadata: ModelMetadata

    def __init__(self, model_path: Path) -> None:
        self.model_path = model_path

    @property
    def device(self) -> str:
        """Where inference runs, e.g. ``"CPUExecutionProvider"`` or ``"xnnpack"``."""
        return "cpu"

    @abc.abstractmethod
    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        """Run the model on one array per input (in `inputs` order); return raw outputs."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release the model. Calling it twice is harmless."""

    def for_worker(self) -> Runtime:
        """A runtime for one more thread calling the same loaded model: this one when `infer`
        may run concurrently, else a backend's per-thread state over the same model (LiteRT:
        another interpreter, as LiteRT requires one per thread; TensorRT: another execution
        context on the one engine). Closing it leaves this runtime open."""
        if self.concurrent:
            return self
        raise NotImplementedError(f"{self.name} cannot serve another thread")

    def warmup(self, runs: int = 1) -> None:
        """Run the model on zeros so the first real frame is not slow (fixed shapes only)."""
        arrays = []
        for spec in self.inputs:
            shape = tuple(1 if d is None else d for d in spec.shape)
            if any(d is None for d in spec.shape) and spec.layout is not None:
                return  # a dynamic image input: the first real frame sets the shape
            arrays.append(np.zeros(shape, dtype=spec.dtype))
        for _ in range(runs):
            self.infer(arrays)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


ConfigT = TypeVar("ConfigT", bound="BackendConfig")


class BackendConfig(BaseModel):
    """The settings of one backend: its section of agent.yaml's ``runtimes:``, also handed to
    check processes as JSON. A backend's model subclasses this with ``type: Literal[NAME] =
    NAME`` and fields of its own, each with a default and a description; unknown keys are
    refused, values are frozen, and validators do no I/O. Each model is built (its validator
    and serializer) when first used, not when its module is imported: a command that runs one
    backend builds that backend's alone (``detect``'s first detection, docs/benchmarks.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)

    type: str


@dataclass(frozen=True)
class LoadOptions:
    """How a caller wants a model loaded: `warmup` on zeros first (one-shot commands skip it);
    `workers`, the calls the caller will have in flight at once (a backend whose calls share
    the cores may give each its share; one that serves a call at a time ignores it); `root`, the
    filesystem root under which a backend that drives a device finds it (``/``; a board's fake
    tree in tests, `agent.hardware.board.Board.root`)."""

    warmup: bool = True
    workers: int = 1
    root: Path = Path("/")


def first_device(info: RuntimeInfo) -> str:
    """The device a backend runs on, for one that names none of its own: the first device its
    probe reported (a LiteRT delegate), else ``"CPU"``."""
    return info.devices[0] if info.devices else "CPU"


#: a tensor shape, e.g. (1, 3, 640, 640)
Shape = tuple[int, ...]
#: representative inputs of a model, each shaped like its input (e.g. (1, 3, 640, 640) float32),
#: read one at a time (a bundle's calibration images, preprocessed): TensorRT's INT8 calibration
Calibration = Callable[[], Iterable[npt.NDArray[Any]]]


@dataclass(frozen=True)
class Progress:
    """Where a long step (an engine build) is: the phase the library reports (e.g. "Building
    engine"), and `fraction` of the top-level phase's steps done, 0..1."""

    phase: str
    fraction: float


@dataclass(frozen=True)
class Prebuilt:
    """A build of an artifact for one kind of device that a bundle ships (a TensorRT engine):
    the key it was built for, in its backend's own terms (TensorRT: `runtimes.engine_cache.
    EngineKey`), and its file. A backend uses it only where that key equals its own exactly."""

    key: Hashable
    path: Path


@dataclass(frozen=True)
class BundleHints:
    """What a bundle's manifest says about its model that a backend's settings take
    (`Backend.for_bundle`): `profile`, the (smallest, tuned-for, largest) input shape a model
    with a dynamic input is served at (the manifest's ``tensorrt_profile``), or None."""

    profile: tuple[Shape, Shape, Shape] | None = None


@dataclass(frozen=True)
class BundleModel:
    """One model artifact of a bundle, as autotune hands it to a backend (`Backend.candidates`,
    `Backend.prepare`): its file, format and precision, its sha256 (the manifest's), the bundle's
    calibration inputs (None when it ships none), and the device builds it ships (`Prebuilt`)."""

    path: Path
    format: ArtifactFormat
    precision: Precision
    sha256: str
    calibration: Calibration | None = None
    prebuilt: tuple[Prebuilt, ...] = ()


@dataclass(frozen=True)
class TuneCandidate:
    """One way a backend could run an artifact here, for autotune and the optimisation report to
    measure: `device` where it runs (the ONNX Runtime execution provider, the LiteRT delegate, the
    GPU), the `precision` it computes in, `workers` calls in flight and `threads` per call (None:
    the backend's default), `config` the settings that make it so; `unavailable` says why it cannot
    run here (its row then carries only that)."""

    device: str
    precision: Precision
    config: BackendConfig
    workers: int = 1
    threads: int | None = None
    unavailable: str | None = None


def worker_variants(cores: int) -> list[tuple[int, int]]:
    """(calls in flight, threads per call) worth trying on `cores` cores: one call using every
    core, and two calls of half the cores each (often faster: one call keeps only part of the
    cores busy, docs/benchmarks.md)."""
    variants = [(1, cores)]
    if cores >= 2:
        variants.append((2, cores // 2))
    return variants


@dataclass(frozen=True)
class CacheEntry:
    """One entry of a backend's cache: the files that make it (removed together) and the sha256
    of the model it was made for (`model`; the leading hex digits of it where the file's name
    keeps only those, 16 at least), or None where the cache cannot tell (an engine whose record
    a crash lost)."""

    model: str | None
    files: tuple[Path, ...]


def manifest_hash(path: Path, sha256: str) -> str:
    """How most caches know a model: by the sha256 the bundle's manifest gives its file."""
    return sha256


#: what a backend's cache keeps at most unless its settings say otherwise, in MiB
CACHE_MAX_MB = 1024


@dataclass(frozen=True)
class Cache(Generic[ConfigT]):
    """A folder of files a backend makes from models and keeps on disk (TensorRT's engines,
    OpenVINO's compiled models), pruned with the bundle store's versions (`runtimes.caches`):
    entries made for a model no installed version uses are removed, then the oldest until the
    rest is within `max_mb`, never an entry the current or previous version uses.

    - `name`: what it holds, for the log (``"engines"``).
    - `folder`: where it is, from the backend's settings (after `Backend.with_state_dir`); None
      where nothing is cached.
    - `entries`: the entries in the folder (files it does not list are never touched: timing
      caches shared by every model, a write in progress).
    - `max_mb`: the most MiB it keeps, from the settings (default `CACHE_MAX_MB`).
    - `model_hash`: the sha256 its entries name a model file by, from the file and the manifest's
      sha256 of it (the default, `manifest_hash`); OpenVINO's IR hashes the ``.xml`` then the ``.bin``.
    """

    name: str
    folder: Callable[[ConfigT], Path | None]
    entries: Callable[[Path], Sequence[CacheEntry]]
    max_mb: Callable[[ConfigT], int] = lambda config: CACHE_MAX_MB
    model_hash: Callable[[Path, str], str] = manifest_hash


@dataclass(frozen=True)
class Lazy:
    """The function `name` of `module`, imported at its first call rather than now (`lazy`)."""

    module: str
    name: str

    def target(self) -> Callable[..., Any]:
        """The function itself, its module imported (`ImportError`, `AttributeError` when missing)."""
        found: Callable[..., Any] = getattr(importlib.import_module(self.module), self.name)
        return found

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.target()(*args, **kwargs)


def lazy(module: str, name: str) -> Callable[..., Any]:
    """The function `name` of `module`, imported at its first call rather than now: a `Backend`
    entry names its heavy code (a library's wrapper, its engine cache: a few ms of imports each)
    this way, so that importing the registry imports none of it (``edge-agent detect`` with ONNX
    Runtime imports no TensorRT module). Typed as any callable, so that it fills a field of
    `Backend` or `Cache` of any signature."""
    return Lazy(module, name)


_BACKEND_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_FORMAT_NAME = re.compile(r"^[a-z0-9]{1,16}$")


@dataclass(frozen=True)
class Backend(Generic[ConfigT]):
    """One runtime backend, as the registry holds it (`runtimes.registry.BACKENDS`).

    - `name`: the registry key (lower-case letters, digits and ``_``), equal to `config`'s
      ``type``: the ``runtimes:`` section, the ``runtime:`` preference, the ``--runtime`` choice.
    - `config`: its settings model; ``config()`` (every field at its default) must be valid.
    - `summary`: what its ``runtimes:`` section holds, in a few words (the JSON Schema's description).
    - `formats`: the artifact formats it loads, by file suffix without the dot (``("onnx",)``),
      best first (between artifacts of one precision; the board's precision order comes first).
    - `rank`: for each `BoardClass`, where ``runtime: auto`` tries it on such a board, lower
      first (ties in registry order); on a class it lacks, ``auto`` never picks it (naming it in
      ``runtime:`` still does). In-tree: tensorrt 10 on nvidia; onnxruntime 20 on nvidia and
      arm, 10 on x86; litert 30 on nvidia, 10 on arm, 20 on x86; openvino 25 on arm, 15 on x86;
      tvm none (named only); hailo 5 on arm (only a .hef artifact and a Hailo chip make it usable);
      rknn 5 on arm, on its SoCs only (`socs`).
    - `libraries`: the top-level modules of its native library, so that a check process killed
      importing it names that library's distribution and version (`runtimes.isolation`).
    - `availability`: whether it can run here, its version and devices, or why not; imports the
      library inside, and says why rather than raising.
    - `availability_at`: the same with its devices looked for under another filesystem root
      (``probe --root``, a board's fake tree); None where `availability` reads no device files.
    - `load`: a model file with these settings as a `Runtime` (warmed up unless told not to);
      raises `RuntimeUnavailable` (cannot run here) or `ModelLoadError` (refuses the model).
    - `device_label`: the device the policy's reason names, from what `availability` found.
    - `tune`: autotune's choice applied to the settings (the device or provider it measured,
      threads per call, None for the backend's default); None where autotune never chooses it.
    - `with_state_dir`: the settings with what they leave to the agent's state directory filled
      in (TensorRT's engine cache); None where they leave nothing.
    - `for_bundle`: the settings with what a bundle's manifest says about its model
      (`BundleHints`: TensorRT takes its input profile); None where the settings take nothing.
    - `candidates`: what autotune and the optimisation report measure of an artifact of one of
      its formats, from the settings (those of the version), the artifact, what the probe found
      and whether to try several calls in flight: a list of `TuneCandidate`, each saying why
      not when it cannot run here. None: one candidate, the settings as they are, on the device
      `device_label` names (or why the backend is unavailable).
    - `prepare`: make a candidate's model ready to load before it is measured, reporting
      `Progress` (TensorRT builds its engine, or takes the bundle's prebuilt one, into its
      cache); raises `BackendError` when it cannot. None where loading is enough.
    - `measured_apart`: autotune measures its rows wholly in a child process, never in the
      agent's (loading its library there keeps memory after the row: OpenVINO).
    - `caches`: the caches it keeps on disk (`Cache`), pruned with the store's versions.
    - `socs`: the SoCs it runs on (the board's `soc`: rknn's ``rk3588``, ``rk3566``, ``rk3568``),
      where ``runtime: auto`` ranks it only on such a board; empty: any board of its `rank`.

    The module holding it must import its native library only inside these callables, never at
    import: the agent imports every registered module, and only check processes import libraries.
    An in-tree entry lives in a light module (``runtimes/<name>_settings.py``, with the settings
    model) and names the rest of its backend's code with `lazy`, so that a process imports the
    code of the backends it loads only.
    """

    name: RuntimeName
    config: type[ConfigT]
    summary: str
    formats: tuple[ArtifactFormat, ...]
    rank: Mapping[BoardClass, int]
    libraries: tuple[str, ...]
    availability: Callable[[], RuntimeInfo]
    load: Callable[[Path, ConfigT, LoadOptions], Runtime]
    device_label: Callable[[RuntimeInfo], str] = first_device
    availability_at: Callable[[Path], RuntimeInfo] | None = None
    tune: Callable[[ConfigT, str, int | None], ConfigT] | None = None
    with_state_dir: Callable[[ConfigT, Path], ConfigT] | None = None
    for_bundle: Callable[[ConfigT, BundleHints], ConfigT] | None = None
    candidates: Callable[[ConfigT, BundleModel, RuntimeInfo, bool], list[TuneCandidate]] | None = None
    prepare: Callable[[ConfigT, BundleModel, Callable[[Progress], None]], None] | None = None
    measured_apart: bool = False
    caches: tuple[Cache[ConfigT], ...] = ()
    socs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Refuse an entry that the rest of the agent could not derive from: `ValueError` names the field."""
        if not isinstance(self.name, str) or not _BACKEND_NAME.match(self.name):
            raise ValueError(f"name {self.name!r}: expected lower-case letters, digits and '_', a letter first")
        if not (isinstance(self.config, type) and issubclass(self.config, BackendConfig)):
            raise ValueError(f"{self.name}: config must be a subclass of runtimes.base.BackendConfig")
        tag = self.config.model_fields["type"].default
        if tag != self.name:
            raise ValueError(f"{self.name}: {self.config.__name__}.type defaults to {tag!r}, not to the name")
        # every field has a default: a section may be left out of agent.yaml (read from the
        # fields, not by validating, which would build every backend's model at import)
        required = [name for name, field in self.config.model_fields.items() if field.is_required()]
        if required:
            raise ValueError(
                f"{self.name}: {self.config.__name__}.{required[0]} has no default; every setting needs one"
            )
        if not self.formats or not all(isinstance(f, str) and _FORMAT_NAME.match(f) for f in self.formats):
            raise ValueError(f"{self.name}: formats {self.formats!r}: expected file suffixes without the dot")
        unknown = set(self.rank) - set(BOARD_CLASSES)
        if unknown or not all(isinstance(r, int) for r in self.rank.values()):
            raise ValueError(f"{self.name}: rank {dict(self.rank)!r}: expected {', '.join(BOARD_CLASSES)} -> int")
        if not self.libraries or not all(isinstance(m, str) and m for m in self.libraries):
            raise ValueError(f"{self.name}: libraries: expected the library's top-level module names")
        if not all(isinstance(cache, Cache) for cache in self.caches):
            raise ValueError(f"{self.name}: caches: expected a tuple of runtimes.base.Cache")
        object.__setattr__(self, "rank", MappingProxyType(dict(self.rank)))
        object.__setattr__(self, "caches", tuple(self.caches))


def return_freed_memory() -> None:
    """Hand memory freed by a closed model back to the operating system.

    glibc keeps freed heap memory for reuse, and a model's arenas are freed in many threads'
    malloc arenas: without this, each model swapped out left 3-4 MB resident (a YOLOv8n at 640:
    RSS 170 -> 220 MB over 20 swaps; flat with it, docs/benchmarks.md). A no-op where the C
    library is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # glibc's mallopt parameters (malloc.h)


def compact_malloc(mmap_threshold: int = 512 * 1024, arenas: int = 2) -> bool:
    """Keep glibc's heap close to what is in use, for a daemon with a few threads per camera.
    Process-wide; True when it took effect, False where the C library is not glibc.

    - Blocks of `mmap_threshold` bytes or more get a mapping of their own, handed back to the
      system when freed. By default glibc raises that threshold to the largest block freed so far
      (up to 32 MiB), so once a frame, a tensor or a model's outputs (1-5 MB each) was freed, the
      next ones come from the allocating thread's arena and its free space stays resident.
    - At most `arenas` malloc arenas instead of 8 per core, so the many threads' small blocks
      share free space instead of each thread keeping its own.

    With 4 cameras of a YOLOv8n at 640, each extra camera cost 12 MB instead of 27 MB
    (docs/benchmarks.md).
    The daemon calls it once at start, before its threads."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_ARENA_MAX, arenas))


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity mask (``taskset``, a cgroup cpuset,
    systemd's ``CPUAffinity=``) where the system has one, else every CPU. `os.cpu_count` counts
    the machine's CPUs whatever the mask: under ``taskset -c 0`` on 2 cores it said 2, so
    ``workers: auto`` measured two calls in flight and ONNX Runtime split one core in two."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (native libraries write pages), or its type."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_inputs(specs: Sequence[TensorSpec], arrays: Sequence[npt.NDArray[Any]]) -> None:
    """Raise `InferenceError` unless `arrays` match `specs` in count, rank, fixed dims and dtype."""
    if len(arrays) != len(specs):
        raise InferenceError(f"model takes {len(specs)} input(s), got {len(arrays)}")
    for spec, array in zip(specs, arrays, strict=True):
        fixed_ok = len(array.shape) == len(spec.shape) and all(
            want is None or want == got for want, got in zip(spec.shape, array.shape, strict=True)
        )
        if not fixed_ok:
            raise InferenceError(f"input {spec.name!r}: expected shape {spec.shape}, got {array.shape}")
        if array.dtype != spec.dtype:
            raise InferenceError(f"input {spec.name!r}: expected dtype {spec.dtype}, got {array.dtype}")
