"""Building a TensorRT engine from an ONNX model (TensorRT 10 Python API).

`build_engine` parses the ONNX file (every parser error reported with its node), configures the
builder (workspace memory-pool limit; FP16 where the GPU has fast FP16; INT8 from an explicitly
quantized Q/DQ model, or through an entropy calibrator fed with calibration batches where the
TensorRT version still has calibrators, with a calibration cache; one optimization profile for
dynamic inputs; a timing cache shared by builds on this GPU), reports progress through
TensorRT's progress monitor, and returns the serialized engine.

A build takes seconds on a desktop GPU and minutes on a Jetson; it runs in the caller's thread
(the daemon's engine builder runs it in a background thread) and can be cancelled between
steps through a `threading.Event`. Nothing here touches the engine cache: see
`runtimes.engine_cache`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from runtimes.base import Calibration, ModelLoadError, Precision, Progress
from runtimes.files import atomic_write

if TYPE_CHECKING:
    import tensorrt as trt

    from runtimes.cuda_memory import DeviceMemory

log = logging.getLogger(__name__)

#: calibration input batches, each shaped like the model's input (e.g. (1, 3, 640, 640) float32)
CalibrationBatches = Calibration


class EngineBuildError(ModelLoadError):
    """TensorRT could not build an engine; `problems` lists each reason (parser errors with their
    node, TensorRT's error log lines)."""

    def __init__(self, message: str, problems: Sequence[str] = ()) -> None:
        super().__init__(message + (": " + "; ".join(problems) if problems else ""))
        self.problems = list(problems)


class BuildCancelled(EngineBuildError):
    """The build was stopped on request (a newer deployment, the agent stopping)."""


@dataclass(frozen=True)
class Profile:
    """An optimization profile of one input: smallest, tuned-for and largest shape."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        if not len(self.min) == len(self.opt) == len(self.max):
            raise ValueError(f"profile shapes differ in rank: {self.min}, {self.opt}, {self.max}")
        if not all(0 < a <= b <= c for a, b, c in zip(self.min, self.opt, self.max, strict=True)):
            raise ValueError(
                f"profile must satisfy 0 < min <= opt <= max per axis, got {self.min}, {self.opt}, {self.max}"
            )

    @classmethod
    def parse(cls, text: str) -> Profile:
        """``N,C,H,W:N,C,H,W:N,C,H,W`` (min:opt:max), as the CLI takes it; raises `ValueError`."""
        parts = text.split(":")
        if len(parts) != 3:
            raise ValueError(f"expected MIN:OPT:MAX shapes like 1,3,320,320:1,3,640,640:1,3,640,640, got {text!r}")
        try:
            shapes = [tuple(int(d) for d in part.split(",")) for part in parts]
        except ValueError as exc:
            raise ValueError(f"profile {text!r}: shapes are integers separated by commas") from exc
        return cls(*shapes)


@dataclass(frozen=True)
class BuildOptions:
    """What to build: `precision`, the builder's workspace limit in MiB, the profile of the dynamic
    input(s), where the timing and calibration caches live, and calibration batches for INT8
    without Q/DQ."""

    precision: Precision = "fp16"
    workspace_mb: int = 1024
    profile: Profile | None = None
    timing_cache: Path | None = None
    calibration: CalibrationBatches | None = None
    calibration_cache: Path | None = None


#: where a build is: the phase TensorRT reports (e.g. "Building engine"), and `fraction` of the
#: top-level phase's steps done, 0..1 (`runtimes.base.Progress`, what `Backend.prepare` reports)
BuildProgress = Progress


@dataclass(frozen=True)
class BuiltEngine:
    """A serialized engine and how it was built: `precision` is what the GPU allowed (fp16 asked
    on a GPU without fast FP16 builds fp32), `int8_source` "qdq" or "calibration" for INT8."""

    data: bytes
    precision: Precision
    int8_source: str | None
    seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)


def require_tensorrt() -> str:
    """TensorRT's version; raises `RuntimeUnavailable` when it is not installed. (Callers then
    ``import tensorrt as trt`` themselves, so that mypy checks every call against the stubs.)"""
    from runtimes.base import RuntimeUnavailable

    try:
        import tensorrt as trt
    except ImportError as exc:
        raise RuntimeUnavailable(f"tensorrt (JetPack / TensorRT wheel) is not installed ({exc})") from exc
    return str(trt.__version__)


def make_logger(errors: list[str] | None = None) -> trt.ILogger:
    """A TensorRT logger that forwards to Python's logging (TensorRT's warnings and errors) and
    collects error lines in `errors`."""
    import tensorrt as trt

    levels = {
        trt.ILogger.Severity.INTERNAL_ERROR: logging.ERROR,
        trt.ILogger.Severity.ERROR: logging.ERROR,
        trt.ILogger.Severity.WARNING: logging.WARNING,
        trt.ILogger.Severity.INFO: logging.DEBUG,
        trt.ILogger.Severity.VERBOSE: logging.DEBUG,
    }

    class _Logger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            level = levels.get(severity, logging.INFO)
            log.log(level, "tensorrt: %s", msg)
            if errors is not None and level >= logging.ERROR:
                errors.append(msg)

    return _Logger()


def parser_errors(parser: trt.OnnxParser) -> list[str]:
    """Each ONNX parser error as ``node N (Op 'name'): description``."""
    problems = []
    for i in range(parser.num_errors):
        error = parser.get_error(i)
        node = error.node()
        where = f"node {node} ({error.node_operator()} {error.node_name()!r})" if node >= 0 else "model"
        problems.append(f"{where}: {error.desc()}")
    return problems


def _has_qdq(network: trt.INetworkDefinition) -> bool:
    import tensorrt as trt

    kinds = (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE)
    return any(network.get_layer(i).type in kinds for i in range(network.num_layers))


def _progress_monitor(
    on_progress: Callable[[BuildProgress], None], cancel: threading.Event | None
) -> trt.IProgressMonitor:
    import tensorrt as trt

    class _Monitor(trt.IProgressMonitor):
        """Keeps each phase's steps; progress is the top-level phase's fraction done."""

        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._phases: dict[str, tuple[str, int, int]] = {}  # name -> (parent, steps, done)
            self._lock = threading.Lock()

        def phase_start(self, phase_name: str, parent_phase: str, num_steps: int) -> None:
            with self._lock:
                self._phases[phase_name] = (parent_phase or "", max(1, num_steps), 0)
            self._report(phase_name)

        def step_complete(self, phase_name: str, step: int) -> bool:
            with self._lock:
                parent, steps, _ = self._phases.get(phase_name, ("", 1, 0))
                self._phases[phase_name] = (parent, steps, step + 1)
            self._report(phase_name)
            return not (cancel is not None and cancel.is_set())

        def phase_finish(self, phase_name: str) -> None:
            with self._lock:
                self._phases.pop(phase_name, None)

        def _report(self, phase: str) -> None:
            with self._lock:
                top = [(steps, done) for parent, steps, done in self._phases.values() if not parent]
            fraction = min(1.0, top[0][1] / top[0][0]) if top else 0.0
            on_progress(BuildProgress(phase, round(fraction, 3)))

    return _Monitor()


def _calibrator(
    batches: CalibrationBatches, cache: Path | None, memory: DeviceMemory, first: npt.NDArray[Any]
) -> trt.IInt8EntropyCalibrator2:
    import tensorrt as trt

    class _Calibrator(trt.IInt8EntropyCalibrator2):
        """Feeds one batch at a time through a device buffer; keeps TensorRT's calibration cache."""

        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._batches = iter(batches())
            self._stream = memory.stream()
            self._buffer = memory.alloc(first.nbytes)

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: list[str]) -> list[int]:
            """One device pointer per input; an empty list ends calibration."""
            batch = next(self._batches, None)
            if batch is None:
                memory.free(self._buffer)
                memory.close_stream(self._stream)
                return []
            memory.to_device(self._buffer, np.ascontiguousarray(batch, dtype=first.dtype), self._stream)
            memory.synchronize(self._stream)
            return [self._buffer.address]

        def read_calibration_cache(self) -> bytes:
            return cache.read_bytes() if cache is not None and cache.is_file() else b""

        def write_calibration_cache(self, cache_data: Any) -> None:
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                cache.write_bytes(bytes(cache_data))

    return _Calibrator()


def _dims(shape: Sequence[int]) -> trt.Dims:
    import tensorrt as trt

    return trt.Dims(list(shape))


def shape_of(dims: trt.Dims) -> tuple[int, ...]:
    """A TensorRT `Dims` as a tuple (-1 for a dynamic axis)."""
    return tuple(int(dims[i]) for i in range(len(dims)))


def _add_profile(
    builder: trt.Builder, config: trt.IBuilderConfig, network: trt.INetworkDefinition, profile: Profile | None
) -> None:
    """One optimization profile covering every input with a dynamic axis (-1); without `profile`,
    a model whose only open axis is the batch gets batch 1."""
    dynamic = [network.get_input(i) for i in range(network.num_inputs)]
    dynamic = [t for t in dynamic if any(d < 0 for d in shape_of(t.shape))]
    if not dynamic:
        return
    if profile is None and all(d >= 0 for t in dynamic for d in shape_of(t.shape)[1:]):
        batch_one = [(t, (1, *shape_of(t.shape)[1:])) for t in dynamic]  # only the batch axis is open: 1
        optimization = builder.create_optimization_profile()
        for tensor, shape in batch_one:
            optimization.set_shape(tensor.name, _dims(shape), _dims(shape), _dims(shape))
        config.add_optimization_profile(optimization)
        return
    if profile is None:
        shapes = ", ".join(f"{t.name}{shape_of(t.shape)}" for t in dynamic)
        raise EngineBuildError(
            f"dynamic input(s) {shapes} need an optimization profile (min/opt/max): set tensorrt_profile in "
            "the bundle's manifest, runtimes.tensorrt.profile in agent.yaml, or --profile"
        )
    optimization = builder.create_optimization_profile()
    for tensor in dynamic:
        shape = shape_of(tensor.shape)
        if len(shape) != len(profile.min) or any(d >= 0 and d != m for d, m in zip(shape, profile.max, strict=True)):
            raise EngineBuildError(
                f"profile {profile.min}:{profile.opt}:{profile.max} does not fit input {tensor.name} of shape {shape}"
            )
        optimization.set_shape(tensor.name, _dims(profile.min), _dims(profile.opt), _dims(profile.max))
    config.add_optimization_profile(optimization)


def _set_precision(
    builder: trt.Builder,
    config: trt.IBuilderConfig,
    network: trt.INetworkDefinition,
    options: BuildOptions,
    memory: DeviceMemory | None,
) -> tuple[Precision, str | None, list[str]]:
    """Set the precision flags; returns (precision built, INT8 source, notes)."""
    import tensorrt as trt

    notes: list[str] = []
    fast_fp16 = builder.platform_has_fast_fp16
    if options.precision in ("fp16", "int8") and fast_fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    if options.precision == "fp16" and not fast_fp16:
        notes.append("this GPU has no fast FP16: built in FP32")
        return "fp32", None, notes
    if options.precision != "int8":
        return options.precision, None, notes
    if _has_qdq(network):
        config.set_flag(trt.BuilderFlag.INT8)
        return "int8", "qdq", notes
    if options.calibration is None:
        raise EngineBuildError("int8 needs an explicitly quantized (Q/DQ) model or the bundle's calibration images")
    if not hasattr(trt, "IInt8EntropyCalibrator2"):
        raise EngineBuildError(
            f"TensorRT {trt.__version__} has no INT8 calibrators: give a Q/DQ model for int8, or build fp16"
        )
    if not builder.platform_has_fast_int8:
        raise EngineBuildError("this GPU has no fast INT8: build fp16")
    if memory is None:
        raise EngineBuildError("INT8 calibration needs device memory (cuda-python or pycuda)")
    first = next(iter(options.calibration()), None)
    if first is None:
        raise EngineBuildError("int8 calibration: the calibration set gave no images")
    config.set_flag(trt.BuilderFlag.INT8)
    config.int8_calibrator = _calibrator(options.calibration, options.calibration_cache, memory, first)
    return "int8", "calibration", notes


def _timing_cache(config: trt.IBuilderConfig, path: Path | None) -> None:
    data = b""
    if path is not None and path.is_file():
        data = path.read_bytes()
    cache = config.create_timing_cache(data)
    if not config.set_timing_cache(cache, False):
        log.warning("tensorrt: timing cache %s does not fit this TensorRT/GPU; starting a new one", path)
        config.set_timing_cache(config.create_timing_cache(b""), False)


def _save_timing_cache(config: trt.IBuilderConfig, path: Path) -> None:
    data = bytes(config.get_timing_cache().serialize())
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)


def build_engine(
    onnx_path: Path,
    options: BuildOptions,
    *,
    on_progress: Callable[[BuildProgress], None] = lambda progress: None,
    cancel: threading.Event | None = None,
    memory: DeviceMemory | None = None,
) -> BuiltEngine:
    """Build a serialized engine from `onnx_path`; raises `EngineBuildError` naming each problem
    (`BuildCancelled` when `cancel` was set), `RuntimeUnavailable` without TensorRT. `memory` is
    needed for INT8 calibration only."""
    require_tensorrt()
    import tensorrt as trt

    start = time.monotonic()
    errors: list[str] = []
    logger = make_logger(errors)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: networks are always explicit-batch
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        raise EngineBuildError(f"TensorRT cannot parse {onnx_path.name}", parser_errors(parser) or errors)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mb << 20)
    _add_profile(builder, config, network, options.profile)
    precision, int8_source, notes = _set_precision(builder, config, network, options, memory)
    _timing_cache(config, options.timing_cache)
    if hasattr(trt, "IProgressMonitor"):
        config.progress_monitor = _progress_monitor(on_progress, cancel)
    serialized = builder.build_serialized_network(network, config)
    if cancel is not None and cancel.is_set():
        raise BuildCancelled(f"the engine build of {onnx_path.name} was cancelled")
    if serialized is None:
        raise EngineBuildError(f"TensorRT could not build an engine from {onnx_path.name}", errors)
    if options.timing_cache is not None:
        _save_timing_cache(config, options.timing_cache)
    seconds = time.monotonic() - start
    log.info("tensorrt: built %s (%s) in %.1f s", onnx_path.name, precision, seconds)
    return BuiltEngine(bytes(serialized), precision, int8_source, round(seconds, 3), tuple(notes))
