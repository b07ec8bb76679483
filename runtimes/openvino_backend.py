"""OpenVINO backend (`runtime: openvino`): ONNX artifacts, and OpenVINO's own IR (format
``openvino``: ``model.xml`` with its weights ``model.bin`` beside it, what `bundle build
--openvino-int8` makes with NNCF), compiled by OpenVINO for the CPU, or for an Intel GPU or NPU
when ``Core.available_devices`` lists one (the ``openvino`` extra).

OpenVINO reads the bundle's ONNX as it is and compiles it for one device, with a performance
hint (LATENCY for one call in flight, THROUGHPUT for several: ``performance_hint: auto``) and the
configured threads (``INFERENCE_NUM_THREADS``). Compiling takes a while, so the compiled model is
cached on disk, keyed like TensorRT's engines (`CompiledKey`: the model files' sha256, the OpenVINO
version, the device and its full name, the hint, the threads, the requests and the inference
precision)::

    <cache_dir>/<digest>.blob    the compiled model (``CompiledModel.export_model``)
    <cache_dir>/<digest>.json    its key and the model's metadata, written after the blob

A blob that OpenVINO cannot import (a truncated file, another build) is discarded and the model
compiled again. Without ``cache_dir`` (the agent fills in ``<state_dir>/openvino``) nothing is
cached. The cache is pruned with the bundle store's versions (`cache_entries`, `runtimes.caches`):
compiled models of a model no installed version has are removed, then the oldest beyond
``cache_max_mb``, never those of the current and previous versions.

Threads: a `CompiledModel` may be shared by threads, an infer request may not; each thread
calling `infer` gets a request of its own on the one compiled model (`concurrent` is True: one
copy of the weights, calls in flight at once in THROUGHPUT's streams). The library is imported only inside
`availability` and `load`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from runtimes.base import (
    BundleModel,
    CacheEntry,
    InferenceError,
    LoadOptions,
    ModelLoadError,
    NotAModelError,
    Runtime,
    RuntimeInfo,
    RuntimeUnavailable,
    TensorSpec,
    TuneCandidate,
    check_inputs,
    first_line,
    guess_layout,
    return_freed_memory,
    usable_cores,
)
from runtimes.files import atomic_write, sha256_file
from runtimes.metadata import parse_metadata
from runtimes.openvino_settings import KEY as KEY
from runtimes.openvino_settings import Device as Device
from runtimes.openvino_settings import Hint as Hint
from runtimes.openvino_settings import OpenVINOConfig as OpenVINOConfig
from runtimes.openvino_settings import with_state_dir as with_state_dir

log = logging.getLogger(__name__)

DEVICES: tuple[Device, ...] = ("CPU", "GPU", "NPU")
_INSTALL = "pip install 'edge-agent[openvino]'"


@dataclass(frozen=True)
class CompiledKey:
    """Everything a compiled model is only valid for; `digest` names its files. `hint` is
    ``LATENCY`` or ``THROUGHPUT``, `threads` 0 for OpenVINO's default, `requests` the calls in
    flight it was compiled for."""

    model_sha256: str  # of the ONNX file, or of an IR's .xml then its .bin
    openvino_version: str
    device: str
    device_name: str
    hint: str
    threads: int
    requests: int
    precision: str = "fp32"

    @property
    def digest(self) -> str:
        """The first 32 hex digits of the sha256 of the key's canonical JSON."""
        canonical = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _import_openvino() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise RuntimeUnavailable(f"openvino is not installed ({exc}); {_INSTALL}") from exc
    return openvino


def availability() -> RuntimeInfo:
    """Whether openvino imports here, its version and the devices it lists (``CPU``, ``GPU``, ``NPU``...)."""
    try:
        ov = _import_openvino()
        devices = tuple(str(d) for d in ov.Core().available_devices)
    except RuntimeUnavailable as exc:
        return RuntimeInfo(name=KEY, available=False, reason=str(exc))
    except RuntimeError as exc:  # the core failed to start its plugins
        return RuntimeInfo(name=KEY, available=False, reason=f"OpenVINO's core failed: {first_line(exc)}")
    if not devices:
        return RuntimeInfo(name=KEY, available=False, reason="OpenVINO lists no device here")
    try:
        version = importlib_metadata.version("openvino")
    except importlib_metadata.PackageNotFoundError:
        version = str(ov.__version__)
    return RuntimeInfo(name=KEY, available=True, version=version, devices=devices)


def device_label(info: RuntimeInfo) -> str:
    """The device the policy's reasons name: OpenVINO on the CPU (the default ``device``)."""
    return "OpenVINO CPU" if "CPU" in info.devices or not info.devices else f"OpenVINO {info.devices[0]}"


def hint_for(config: OpenVINOConfig, workers: int) -> str:
    """The performance hint to compile with: the configured one, or for ``auto`` LATENCY with one
    call in flight and THROUGHPUT with several."""
    if config.performance_hint == "auto":
        return "THROUGHPUT" if workers > 1 else "LATENCY"
    return config.performance_hint.upper()


def model_files(model_path: Path) -> tuple[Path, ...]:
    """The files OpenVINO reads for `model_path`: the ONNX file, or an IR's ``.xml`` and the
    ``.bin`` of the same name beside it."""
    return (model_path, model_path.with_suffix(".bin")) if model_path.suffix.lower() == ".xml" else (model_path,)


def _spec(port: Any) -> TensorSpec:
    shape = tuple(int(d.get_length()) if d.is_static else None for d in port.get_partial_shape())
    try:
        dtype = np.dtype(port.get_element_type().to_dtype())
    except (RuntimeError, TypeError) as exc:
        raise ModelLoadError(f"tensor {port.get_any_name()!r} has unsupported type {port.get_element_type()}") from exc
    return TensorSpec(port.get_any_name(), shape, dtype, layout=guess_layout(shape))


def _metadata_of(model: Any) -> dict[str, str]:
    """The ONNX file's metadata properties, which OpenVINO keeps as ``rt_info["framework"]``."""
    if not model.has_rt_info(["framework"]):
        return {}
    return {str(k): model.get_rt_info(["framework", str(k)]).astype(str) for k in model.get_rt_info()["framework"]}


@dataclass(frozen=True)
class _Compiled:
    """What every worker of one loaded model shares: the compiled model and its description."""

    compiled: Any
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    raw_metadata: dict[str, str]
    device: str
    key: CompiledKey
    from_cache: bool


def _properties(key: CompiledKey) -> dict[str, Any]:
    props: dict[str, Any] = {"PERFORMANCE_HINT": key.hint}
    if key.threads:
        props["INFERENCE_NUM_THREADS"] = key.threads
    if key.precision == "fp32":
        props["INFERENCE_PRECISION_HINT"] = "f32"
    if key.hint == "THROUGHPUT":
        props["PERFORMANCE_HINT_NUM_REQUESTS"] = key.requests
    return props


def _reason(exc: BaseException) -> str:
    """The line of an OpenVINO error that says what is wrong (its first lines name C++ files)."""
    lines = [line.strip(" -") for line in str(exc).splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(("Exception from", "Check "))]
    return useful[-1] if useful else first_line(exc)


def compile_model(model_path: Path, config: OpenVINOConfig, workers: int = 1) -> _Compiled:
    """Compile `model_path` (ONNX, or an IR's ``.xml``) for `config.device`, or import it from
    the cache when compiled before with the same key. Raises `RuntimeUnavailable` (no openvino,
    device not listed) or `ModelLoadError` / `NotAModelError` (OpenVINO refuses the file, an IR
    without its weights)."""
    ov = _import_openvino()
    if not model_path.is_file():
        raise ModelLoadError(f"model file not found: {model_path}")
    files = model_files(model_path)
    if not files[-1].is_file():
        raise ModelLoadError(f"OpenVINO IR {model_path.name} needs its weights {files[-1].name} beside it")
    core = ov.Core()
    devices = [str(d) for d in core.available_devices]
    if config.device not in devices:
        raise RuntimeUnavailable(
            f"OpenVINO has no {config.device} device here (it lists {', '.join(devices) or 'none'}); "
            "set runtimes.openvino.device to one of those"
        )
    key = CompiledKey(
        model_sha256=sha256_file(*files),
        openvino_version=str(ov.__version__),
        device=config.device,
        device_name=str(core.get_property(config.device, "FULL_DEVICE_NAME")),
        hint=hint_for(config, workers),
        threads=config.threads,
        requests=max(1, workers),
        precision=config.inference_precision,
    )
    cached = _import_cached(core, key, config.cache_dir)
    if cached is not None:
        return cached
    try:
        model = core.read_model(str(model_path))
    except RuntimeError as exc:
        why = _reason(exc)
        if "conversion" in str(exc).lower():  # a model, with an operator OpenVINO has no rule for
            raise ModelLoadError(f"OpenVINO cannot run {model_path.name}: {why}") from exc
        raise NotAModelError(f"OpenVINO cannot read {model_path}: {why}") from exc
    raw = _metadata_of(model)
    try:
        compiled = core.compile_model(model, config.device, _properties(key))
    except RuntimeError as exc:
        why = first_line(exc)
        raise ModelLoadError(f"OpenVINO cannot compile {model_path.name} for {config.device}: {why}") from exc
    if config.cache_dir is not None:
        _store(compiled, key, raw, config.cache_dir)
    inputs, outputs = [_spec(p) for p in compiled.inputs], [_spec(p) for p in compiled.outputs]
    return _Compiled(compiled, inputs, outputs, raw, config.device, key, from_cache=False)


def _import_cached(core: Any, key: CompiledKey, cache_dir: Path | None) -> _Compiled | None:
    """The cached compiled model of `key`, or None (not cached, or its blob would not import:
    then discarded, to be compiled again)."""
    if cache_dir is None:
        return None
    blob, record = cache_dir / f"{key.digest}.blob", cache_dir / f"{key.digest}.json"
    if not (blob.is_file() and record.is_file()):
        return None
    try:
        document = json.loads(record.read_text())
        if document.get("key") != asdict(key):
            raise ValueError("its record names another key")
        compiled = core.import_model(blob.read_bytes(), key.device, _properties(key))
        inputs, outputs = [_spec(p) for p in compiled.inputs], [_spec(p) for p in compiled.outputs]
    except (OSError, ValueError, RuntimeError, ModelLoadError) as exc:
        log.warning("discarding the cached OpenVINO model %s: %s", blob, first_line(exc))
        blob.unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        return None
    raw = {str(k): str(v) for k, v in dict(document.get("metadata", {})).items()}
    return _Compiled(compiled, inputs, outputs, raw, key.device, key, from_cache=True)


def _store(compiled: Any, key: CompiledKey, raw: dict[str, str], cache_dir: Path) -> None:
    """Write the blob, then its record (both temp + rename): a crash never leaves a record
    naming a half-written blob. A cache that cannot be written is logged, not fatal."""
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(cache_dir / f"{key.digest}.blob", bytes(compiled.export_model().getvalue()))
        document = {"key": asdict(key), "metadata": raw}
        atomic_write(cache_dir / f"{key.digest}.json", json.dumps(document, indent=1).encode())
    except (OSError, RuntimeError) as exc:
        log.warning("cannot cache the compiled OpenVINO model in %s: %s", cache_dir, first_line(exc))


class OpenVINOBackend(Runtime):
    """A model compiled by OpenVINO; each thread that calls `infer` gets an infer request of
    its own on the one compiled model (`concurrent`: the model's streams serve them at once)."""

    name = KEY
    concurrent = True

    def __init__(self, model_path: Path, shared: _Compiled, warmup: bool = True) -> None:
        super().__init__(model_path)
        self._shared: _Compiled | None = shared
        self._key = shared.key
        self._from_cache = shared.from_cache
        self._device = shared.device
        self.inputs = shared.inputs
        self.outputs = shared.outputs
        self.metadata = parse_metadata(shared.raw_metadata)
        self._requests = threading.local()
        if warmup:
            self.warmup()

    @property
    def device(self) -> str:
        return self._device

    @property
    def key(self) -> CompiledKey:
        """What the compiled model was compiled for (its cache key)."""
        return self._key

    @property
    def from_cache(self) -> bool:
        """Whether the compiled model came from the on-disk cache rather than a compile."""
        return self._from_cache

    def close(self) -> None:
        """Drop the compiled model (its requests go with the threads that made them) and return
        the freed memory to the system."""
        if self._shared is not None:
            self._shared = None
            self._requests = threading.local()
            return_freed_memory()

    def _request(self) -> Any:
        """This thread's infer request, made on its first call."""
        request = getattr(self._requests, "request", None)
        if request is None:
            shared = self._shared
            if shared is None:
                raise InferenceError(f"{self.model_path.name} was closed")
            request = self._requests.request = shared.compiled.create_infer_request()
        return request

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        check_inputs(self.inputs, arrays)
        if self._shared is None:
            raise InferenceError(f"{self.model_path.name} was closed")
        request = self._request()
        try:
            request.infer({i: np.ascontiguousarray(a) for i, a in enumerate(arrays)})
            # the request reuses its output tensors: copy them before the next call
            return [np.array(request.get_output_tensor(i).data) for i in range(len(self.outputs))]
        except RuntimeError as exc:
            raise InferenceError(f"OpenVINO failed on {self.model_path.name}: {first_line(exc)}") from exc


def load(model_path: Path, config: OpenVINOConfig, options: LoadOptions) -> OpenVINOBackend:
    """The registry's loader: compiled (or imported from the cache) for `options.workers` calls
    in flight (with ``performance_hint: auto``, THROUGHPUT's streams for more than one)."""
    shared = compile_model(model_path, config, options.workers)
    log.info(
        "openvino %s %s on %s (%s, %s threads)",
        "imported cached" if shared.from_cache else "compiled",
        model_path,
        shared.device,
        shared.key.hint,
        config.threads or "default",
    )
    return OpenVINOBackend(model_path, shared, options.warmup)


def tune(config: OpenVINOConfig, device: str, threads: int | None) -> OpenVINOConfig:
    """Autotune's choice: the device it measured (CPU when unknown) and its threads (None:
    OpenVINO's default); the hint follows the workers (``auto``)."""
    chosen = next((d for d in DEVICES if d == device), "CPU")
    return config.model_copy(update={"device": chosen, "threads": threads or 0})


def candidates(config: OpenVINOConfig, model: BundleModel, info: RuntimeInfo, variants: bool) -> list[TuneCandidate]:
    """Per device OpenVINO lists (CPU, an Intel GPU or NPU): one call in flight (the LATENCY
    hint), and with `variants` on the CPU also two (THROUGHPUT's streams, ``performance_hint:
    auto``); one row saying why when OpenVINO cannot run here."""
    if not info.available:
        return [TuneCandidate("CPU", model.precision, config, unavailable=info.reason or "unavailable")]
    found = []
    for device in (d for d in DEVICES if d in info.devices):
        shapes = [1, 2] if variants and device == "CPU" and usable_cores() >= 2 else [1]
        tuned = config.model_copy(update={"device": device})
        found += [TuneCandidate(device, model.precision, tuned, workers=workers) for workers in shapes]
    return found


def cache_entries(folder: Path) -> list[CacheEntry]:
    """The compiled models in the cache `folder`, each (blob and record) by its key's model sha256;
    a blob whose record is missing or unreadable by none."""
    entries = []
    for blob in sorted(folder.glob("*.blob")):
        record = blob.with_suffix(".json")
        try:
            model: str | None = str(json.loads(record.read_bytes())["key"]["model_sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            model = None
        entries.append(CacheEntry(model, (blob, record) if record.exists() else (blob,)))
    return entries


def model_hash(path: Path, sha256: str) -> str:
    """The sha256 a compiled model's key names a model file by (`CompiledKey.model_sha256`): the
    manifest's of an ONNX file; an IR's ``.xml`` then its ``.bin``, hashed as one stream."""
    files = model_files(path)
    return sha256 if len(files) == 1 else sha256_file(*files)
