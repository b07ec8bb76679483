"""Apache TVM backend (`runtime: tvm`, the ``tvm`` extra): an ONNX model compiled here for this
CPU, or a module compiled at the operator (``bundle build --tvm-target``, format ``tvm``), run by
TVM's Relax virtual machine.

A module is a shared library (``model.so``, TVM's ``export_library``) and its record beside it
(``model.so.json``): the target it was compiled for (a TVM target as JSON: ``kind``,
``mtriple``, ``mcpu``, ``mattr``), its architecture, the TVM version, and the ONNX model's
inputs, outputs and metadata as ONNX Runtime reads them, so that the decoding of a module is the
ONNX model's (`runtimes.metadata.parse_metadata`, the same `TensorSpec`s). A module is native
code: one shipped in a bundle is loaded only with ``runtimes.tvm.allow_compiled`` (the installer
takes such a bundle only when signed), and only where its architecture and TVM release are this
machine's: else `TargetMismatch` (``TARGET_MISMATCH``), naming both, before the library is opened.

An ONNX model is compiled here (``llvm`` with this CPU's triple and name, TVM's
``Target.from_device``), which takes seconds to a minute, and cached like OpenVINO's compiled
models: ``<cache_dir>/<digest>.so`` and its record ``<digest>.so.json``, the digest of the key
(the model's sha256, the target, the TVM version). Without ``cache_dir`` (the agent fills in
``<state_dir>/tvm``; a command line has none) the cache is the user's, `user_cache`; where that
cannot be written the module is compiled into a temporary folder and dropped after loading.
The dynamic axes of an input (a dynamic batch) are fixed at compile time: batch 1, and the size
of the model's ``imgsz`` metadata (else 640) for a dynamic height or width.

Threads: a virtual machine serves one call at a time (`concurrent` False). The library is
imported only inside `availability`, `load`, `compile_module` and `candidates`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shlex
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
    Runtime,
    RuntimeInfo,
    RuntimeUnavailable,
    TensorSpec,
    TuneCandidate,
    check_inputs,
    first_line,
    guess_layout,
    return_freed_memory,
)
from runtimes.files import FileTooLarge, atomic_write, move_into_place, read_at_most, sha256_file
from runtimes.metadata import parse_metadata
from runtimes.tvm_settings import KEY as KEY
from runtimes.tvm_settings import TVMConfig as TVMConfig

log = logging.getLogger(__name__)

_INSTALL = "pip install 'edge-agent[tvm]' (x86-64), or TVM built from source (docs/tvm.md)"
#: the suffix of a module's record, beside the module (``model.so.json``)
RECORD_SUFFIX = ".json"
#: the largest record read (bytes): bounded before parsing
MAX_RECORD_BYTES = 1 << 20
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "armv8": "aarch64"}


class TargetMismatch(ModelLoadError):
    """A compiled module built for another architecture or TVM release than this machine's
    (``TARGET_MISMATCH``)."""


def canonical_arch(name: str) -> str:
    """``x86_64`` or ``aarch64`` (or the name, lower-case) for a machine or a triple's first part."""
    name = name.strip().lower()
    return _ARCH_ALIASES.get(name, name)


def host_arch() -> str:
    return canonical_arch(platform.machine())


def parse_target(text: str) -> dict[str, Any]:
    """A TVM target as a JSON dict, from JSON (``{"kind": "llvm", "mcpu": ...}``) or the command
    line form older TVMs took (``llvm -mtriple=aarch64-linux-gnu -mcpu=cortex-a76
    -mattr=+neon``); `ValueError` says what is wrong. TVM 0.27 takes only the dict."""
    text = text.strip()
    if len(text) > 1000:
        raise ValueError(f"a target of {len(text)} characters: at most 1000")
    if text.startswith("{"):
        given = json.loads(text)
        if not isinstance(given, dict) or not isinstance(given.get("kind"), str):
            raise ValueError(f"target {text!r}: expected a JSON object with a kind")
        return {str(k): v for k, v in given.items()}
    words = shlex.split(text)
    if not words or words[0].startswith("-"):
        raise ValueError(f"target {text!r}: expected a kind first, e.g. llvm -mtriple=aarch64-linux-gnu")
    target: dict[str, Any] = {"kind": words[0]}
    for word in words[1:]:
        key, eq, value = word.lstrip("-").partition("=")
        if not word.startswith("-") or not eq or not key:
            raise ValueError(f"target {text!r}: {word!r} is not an option like -mcpu=cortex-a76")
        target[key] = value.split(",") if key in ("mattr", "keys", "libs") else value
    return target


def target_arch(target: Mapping[str, Any]) -> str:
    """The architecture a target compiles for: its triple's first part; this machine's without one."""
    triple = str(target.get("mtriple", ""))
    return canonical_arch(triple.split("-")[0]) if triple else host_arch()


def _release(version: str) -> str:
    """``0.27.0`` of ``0.27.0.post1`` or ``0.27.0.dev12+g1234``: what a module's runtime must equal."""
    return ".".join(version.replace("+", ".").split(".")[:3])


@dataclass(frozen=True)
class ModuleRecord:
    """What a compiled module was compiled for and from (its ``.so.json`` beside it)."""

    target: dict[str, Any]
    arch: str
    tvm_version: str
    model_sha256: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    metadata: dict[str, str]

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, indent=1, sort_keys=True).encode()

    @classmethod
    def read(cls, module: Path) -> ModuleRecord:
        """The record beside `module`; `ModelLoadError` when it is missing, too large or wrong."""
        path = module.with_name(module.name + RECORD_SUFFIX)
        try:
            data = read_at_most(path, MAX_RECORD_BYTES)
        except FileTooLarge as exc:
            raise ModelLoadError(str(exc)) from exc
        except OSError as exc:
            raise ModelLoadError(f"TVM module {module.name} needs its record {path.name} beside it: {exc}") from exc
        try:
            doc = json.loads(data)
            return cls(
                target=dict(doc["target"]),
                arch=str(doc["arch"]),
                tvm_version=str(doc["tvm_version"]),
                model_sha256=str(doc["model_sha256"]),
                inputs=[dict(s) for s in doc["inputs"]],
                outputs=[dict(s) for s in doc["outputs"]],
                metadata={str(k): str(v) for k, v in dict(doc["metadata"]).items()},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{path.name} is not a TVM module record: {type(exc).__name__}: {exc}") from exc


def _spec_json(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "shape": list(spec.shape), "dtype": str(spec.dtype)}


def _spec(doc: Mapping[str, Any]) -> TensorSpec:
    shape = tuple(None if d is None else int(d) for d in doc["shape"])
    return TensorSpec(str(doc["name"]), shape, np.dtype(str(doc["dtype"])), layout=guess_layout(shape))


def _import_tvm() -> Any:
    try:
        import tvm
        from tvm import relax  # noqa: F401  (the virtual machine)
    except Exception as exc:  # a broken build raises more than ImportError (a missing libtvm: OSError)
        raise RuntimeUnavailable(f"tvm does not import ({type(exc).__name__}: {first_line(exc)}); {_INSTALL}") from exc
    return tvm


def availability() -> RuntimeInfo:
    """Whether tvm imports here, its version, and the CPU it compiles for."""
    try:
        tvm = _import_tvm()
    except RuntimeUnavailable as exc:
        return RuntimeInfo(name=KEY, available=False, reason=str(exc))
    return RuntimeInfo(name=KEY, available=True, version=str(tvm.__version__), devices=("CPU",))


def host_target() -> dict[str, Any]:
    """This machine's CPU as a TVM target: ``llvm`` with its triple and CPU name (its features)."""
    tvm = _import_tvm()
    found = tvm.target.Target.from_device(tvm.cpu())
    target: dict[str, Any] = {"kind": "llvm", "mtriple": str(found.attrs["mtriple"])}
    if "mcpu" in found.attrs:
        target["mcpu"] = str(found.attrs["mcpu"])
    return target


def check_target(record: ModuleRecord, module: Path, tvm_version: str) -> None:
    """`TargetMismatch` naming both when `record`'s module cannot run here: another architecture,
    or another TVM release (a module's calls into the runtime are not a stable interface)."""
    here = host_arch()
    if record.arch != here:
        raise TargetMismatch(
            f"TARGET_MISMATCH: {module.name} was compiled for {record.arch} ({json.dumps(record.target)}), "
            f"this device is {here}"
        )
    if _release(record.tvm_version) != _release(tvm_version):
        raise TargetMismatch(
            f"TARGET_MISMATCH: {module.name} was compiled with TVM {record.tvm_version}, "
            f"this device runs TVM {tvm_version}"
        )


def _fixed_shape(spec: TensorSpec, size: int) -> list[int]:
    """The shape `spec` is compiled for: batch 1, a dynamic height or width `size`."""
    return [d if d is not None else (1 if i == 0 else size) for i, d in enumerate(spec.shape)]


def compile_module(model_path: Path, target: Mapping[str, Any], out: Path) -> ModuleRecord:
    """Compile the ONNX model `model_path` for `target` into the module `out` (``.so``) and its
    record beside it. Another architecture than this machine's links with that triple's gcc
    (``aarch64-linux-gnu-gcc``: Debian's ``gcc-aarch64-linux-gnu``). Raises `RuntimeUnavailable`
    (no tvm, no cross compiler) or `ModelLoadError` (TVM cannot import or compile the model)."""
    from runtimes.registry import load_runtime

    tvm = _import_tvm()
    try:
        import onnx
        from tvm.relax.frontend.onnx import from_onnx
        from tvm.support import cc
    except ImportError as exc:
        raise RuntimeUnavailable(f"compiling for TVM needs onnx ({exc}); {_INSTALL}") from exc
    arch = target_arch(target)
    fcompile = None
    if arch != host_arch():
        triple = str(target.get("mtriple", ""))
        gcc = shutil.which(f"{triple}-gcc")
        if gcc is None:
            raise RuntimeUnavailable(
                f"linking a module for {triple} needs {triple}-gcc on the PATH "
                f"(Debian: apt-get install gcc-{arch}-linux-gnu)"
            )
        fcompile = cc.cross_compiler(gcc)
    # the inputs, outputs and metadata as ONNX Runtime reads them: the decoding is the ONNX model's
    with load_runtime("onnxruntime", model_path, warmup=False) as reference:
        inputs, outputs, raw = reference.inputs, reference.outputs, dict(reference.metadata.raw)
        size = max(reference.metadata.imgsz or (640,))
    shapes = {spec.name: _fixed_shape(spec, size) for spec in inputs}
    try:
        module = from_onnx(onnx.load(str(model_path)), shape_dict=shapes)
        executable = tvm.compile(module, tvm.target.Target(dict(target)))
        with tempfile.TemporaryDirectory(dir=out.parent) as work:
            built = Path(work) / out.name
            executable.export_library(str(built), fcompile=fcompile)
            move_into_place(built, out)
    except Exception as exc:  # TVM raises its own error types for an operator it cannot convert
        raise ModelLoadError(f"TVM cannot compile {model_path.name}: {type(exc).__name__}: {first_line(exc)}") from exc
    fixed = [TensorSpec(s.name, tuple(shapes[s.name]), s.dtype, layout=s.layout) for s in inputs]
    record = ModuleRecord(
        target=dict(target),
        arch=arch,
        tvm_version=str(tvm.__version__),
        model_sha256=sha256_file(model_path),
        inputs=[_spec_json(s) for s in fixed],
        outputs=[_spec_json(s) for s in outputs],
        metadata=raw,
    )
    atomic_write(out.with_name(out.name + RECORD_SUFFIX), record.to_json())
    return record


def cache_key(model_sha256: str, target: Mapping[str, Any], tvm_version: str) -> str:
    """The digest that names a module compiled here: 32 hex digits of the key's canonical JSON."""
    key = {"model_sha256": model_sha256, "target": dict(target), "tvm_version": tvm_version}
    return hashlib.sha256(json.dumps(key, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]


class TVMBackend(Runtime):
    """A compiled module on TVM's Relax virtual machine, one call at a time."""

    name = KEY

    def __init__(self, model_path: Path, module: Path, record: ModuleRecord, warmup: bool = True) -> None:
        super().__init__(model_path)
        tvm = _import_tvm()
        check_target(record, module, str(tvm.__version__))
        try:
            library = tvm.runtime.load_module(str(module))
            self._vm: Any = tvm.relax.VirtualMachine(library, tvm.cpu())
            self._main = self._vm["main"]
        except Exception as exc:  # a library that does not load here, or no main function
            raise ModelLoadError(f"TVM cannot load {module.name}: {type(exc).__name__}: {first_line(exc)}") from exc
        self._tvm = tvm
        self.record = record
        self.inputs = [_spec(s) for s in record.inputs]
        self.outputs = [_spec(s) for s in record.outputs]
        self.metadata = parse_metadata(record.metadata)
        if warmup:
            self.warmup()

    @property
    def device(self) -> str:
        return "CPU"

    def close(self) -> None:
        if self._vm is not None:
            self._vm = self._main = None
            return_freed_memory()

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        check_inputs(self.inputs, arrays)
        main = self._main
        if main is None:
            raise InferenceError(f"{self.model_path.name} was closed")
        try:
            result = main(*(self._tvm.runtime.tensor(np.ascontiguousarray(a)) for a in arrays))
            values = [result] if hasattr(result, "numpy") else list(result)
            return [np.array(v.numpy()) for v in values]
        except Exception as exc:
            raise InferenceError(
                f"TVM failed on {self.model_path.name}: {type(exc).__name__}: {first_line(exc)}"
            ) from exc


def load(model_path: Path, config: TVMConfig, options: LoadOptions) -> TVMBackend:
    """The registry's loader: a module (``.so``, only with `TVMConfig.allow_compiled`), or an ONNX
    model compiled for this CPU (or found in the cache)."""
    if not model_path.is_file():
        raise ModelLoadError(f"model file not found: {model_path}")
    if model_path.suffix == ".so":
        if not config.allow_compiled:
            raise ModelLoadError(
                f"{model_path.name} is a compiled TVM module (native code): set runtimes.tvm.allow_compiled "
                "in agent.yaml to load one (docs/security.md)"
            )
        return TVMBackend(model_path, model_path, ModuleRecord.read(model_path), options.warmup)
    tvm = _import_tvm()
    target = host_target()
    digest = cache_key(sha256_file(model_path), target, str(tvm.__version__))
    folder = config.cache_dir or user_cache()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("cannot cache TVM modules in %s (%s): compiling into a temporary folder", folder, exc)
        with tempfile.TemporaryDirectory(prefix="edge-agent-tvm-") as work:
            module = Path(work) / f"{digest}.so"
            record = compile_module(model_path, target, module)
            return TVMBackend(model_path, module, record, options.warmup)  # loaded: the files may go
    module = folder / f"{digest}.so"
    if module.is_file():
        try:
            backend = TVMBackend(model_path, module, ModuleRecord.read(module), options.warmup)
            log.info("tvm loaded the cached module of %s (%s)", model_path, module.name)
            return backend
        except ModelLoadError as exc:
            log.warning("discarding the cached TVM module %s: %s", module, exc)
            _remove(module)
    record = compile_module(model_path, target, module)
    log.info("tvm compiled %s for %s into %s", model_path, json.dumps(target), module)
    return TVMBackend(model_path, module, record, options.warmup)


def user_cache(environ: Mapping[str, str] = os.environ) -> Path:
    """Where a command line without a state directory (``detect``, ``bench``) caches the modules
    it compiles: ``$XDG_CACHE_HOME/edge-agent/tvm``, else ``~/.cache/edge-agent/tvm``."""
    base = environ.get("XDG_CACHE_HOME", "")[:4096]
    return (Path(base) if base else Path.home() / ".cache") / "edge-agent" / "tvm"


def _remove(module: Path) -> None:
    module.unlink(missing_ok=True)
    module.with_name(module.name + RECORD_SUFFIX).unlink(missing_ok=True)


def candidates(config: TVMConfig, model: BundleModel, info: RuntimeInfo, variants: bool) -> list[TuneCandidate]:
    """One row: the artifact on this CPU; for a module, why it cannot run here when it is not
    allowed (`TVMConfig.allow_compiled`) or was compiled for another target (``TARGET_MISMATCH``)."""
    why = None if info.available else info.reason or "unavailable"
    if why is None and model.format == "tvm":
        try:
            check_target(ModuleRecord.read(model.path), model.path, info.version or "")
        except ModelLoadError as exc:
            why = str(exc)
        if why is None and not config.allow_compiled:
            why = "a compiled TVM module: runtimes.tvm.allow_compiled is off"
    return [TuneCandidate("CPU", model.precision, config, unavailable=why)]


def cache_entries(folder: Path) -> list[CacheEntry]:
    """The modules in the cache `folder`, each (module and record) by its record's model sha256."""
    entries = []
    for module in sorted(folder.glob("*.so")):
        record = module.with_name(module.name + RECORD_SUFFIX)
        try:
            model: str | None = ModuleRecord.read(module).model_sha256
        except ModelLoadError:
            model = None
        entries.append(CacheEntry(model, (module, record) if record.exists() else (module,)))
    return entries
