"""Rockchip RKNN backend (`runtime: rknn`, format ``rknn``): a model converted at the operator by
rknn-toolkit2 (``bundle build --rknn rk3588``) run on the SoC's NPU by rknn-toolkit-lite2's
``rknnlite.api.RKNNLite`` (aarch64 only).

An ``.rknn`` file comes with its record beside it (``model.rknn.json``): the platform it was
converted for (``rk3588``, ``rk3566``, ``rk3568``), the toolkit's version, its quantization, and
the ONNX model's inputs, outputs and metadata as ONNX Runtime reads them, so that its outputs
are decoded as the ONNX model's (`runtimes.metadata.parse_metadata`). A model converted for
another SoC than this board's (``/proc/device-tree/compatible``) is refused before RKNNLite
opens it: `TargetMismatch` (``TARGET_MISMATCH``), naming both.

The pipeline's tensor is the ONNX model's (NCHW float); RKNNLite takes it as NHWC
(``data_format="nhwc"``, its default for 4-D inputs) and returns the outputs as float32 in the
ONNX model's shapes. RKNNLite reports failure by return code (``load_rknn``, ``init_runtime``:
0 is success) and by an ``inference`` that returns None.

Threads: one RKNNLite context serves one call at a time (`concurrent` False). The library is
imported only inside `availability` and `load`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from runtimes.base import (
    BundleModel,
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
)
from runtimes.files import FileTooLarge, read_at_most
from runtimes.metadata import parse_metadata
from runtimes.rknn_settings import CORE_MASKS, PLATFORMS, rockchip_soc
from runtimes.rknn_settings import KEY as KEY
from runtimes.rknn_settings import RKNNConfig as RKNNConfig

log = logging.getLogger(__name__)

_INSTALL = "pip install rknn-toolkit-lite2 (aarch64, with Rockchip's librknnrt.so; docs/rknn.md)"
#: the suffix of a model's record, beside it (``model.rknn.json``)
RECORD_SUFFIX = ".json"
#: the largest record read (bytes): bounded before parsing
MAX_RECORD_BYTES = 1 << 20
#: where the board names its SoC (NUL-separated strings); tests point it at a fake board's tree
COMPATIBLE = Path("/proc/device-tree/compatible")
_MAX_COMPATIBLE_BYTES = 4096


class TargetMismatch(ModelLoadError):
    """An ``.rknn`` model converted for another SoC than this board's (``TARGET_MISMATCH``)."""


@dataclass(frozen=True)
class RKNNRecord:
    """What an ``.rknn`` model was converted for and from (its ``.rknn.json`` beside it)."""

    platform: str
    toolkit_version: str
    quantization: str  # "i8" or "fp16": rknn-toolkit2's config(quantized_dtype) or none
    model_sha256: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    metadata: dict[str, str]

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, indent=1, sort_keys=True).encode()

    @classmethod
    def read(cls, model: Path) -> RKNNRecord:
        """The record beside `model`; `ModelLoadError` when it is missing, too large or wrong."""
        path = model.with_name(model.name + RECORD_SUFFIX)
        try:
            data = read_at_most(path, MAX_RECORD_BYTES)
        except FileTooLarge as exc:
            raise ModelLoadError(str(exc)) from exc
        except OSError as exc:
            raise ModelLoadError(f"RKNN model {model.name} needs its record {path.name} beside it: {exc}") from exc
        try:
            doc = json.loads(data)
            record = cls(
                platform=str(doc["platform"]),
                toolkit_version=str(doc["toolkit_version"]),
                quantization=str(doc["quantization"]),
                model_sha256=str(doc["model_sha256"]),
                inputs=[dict(s) for s in doc["inputs"]],
                outputs=[dict(s) for s in doc["outputs"]],
                metadata={str(k): str(v) for k, v in dict(doc["metadata"]).items()},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{path.name} is not an RKNN model record: {type(exc).__name__}: {exc}") from exc
        if record.platform not in PLATFORMS:
            raise ModelLoadError(f"{path.name}: platform {record.platform!r}, expected one of {', '.join(PLATFORMS)}")
        return record


def spec_json(spec: TensorSpec) -> dict[str, Any]:
    return {"name": spec.name, "shape": list(spec.shape), "dtype": str(spec.dtype)}


def _spec(doc: Mapping[str, Any]) -> TensorSpec:
    shape = tuple(None if d is None else int(d) for d in doc["shape"])
    return TensorSpec(str(doc["name"]), shape, np.dtype(str(doc["dtype"])), layout=guess_layout(shape))


def host_platform(compatible: Path | None = None) -> str | None:
    """This board's RKNN platform from its device tree (`COMPATIBLE`); None off a Rockchip board."""
    try:
        with (compatible or COMPATIBLE).open("rb") as file:
            data = file.read(_MAX_COMPATIBLE_BYTES)
    except OSError:
        return None
    return rockchip_soc(data.decode("ascii", "replace").split("\x00"))


def check_target(record: RKNNRecord, model: Path, platform: str | None) -> None:
    """`TargetMismatch` naming both when `model` was converted for another SoC than `platform`."""
    if record.platform != platform:
        here = platform or "not a Rockchip RK3588/RK3566/RK3568 board"
        raise TargetMismatch(
            f"TARGET_MISMATCH: {model.name} was converted for {record.platform} "
            f"(rknn-toolkit2 {record.toolkit_version}), this device is {here}"
        )


def _import_rknnlite() -> Any:
    try:
        from rknnlite.api import RKNNLite
    except Exception as exc:  # a missing librknnrt.so raises OSError, not ImportError
        raise RuntimeUnavailable(
            f"rknnlite does not import ({type(exc).__name__}: {first_line(exc)}); {_INSTALL}"
        ) from exc
    return RKNNLite


def availability(root: Path = Path("/")) -> RuntimeInfo:
    """Whether rknnlite imports here, and the NPU of the SoC of the board under `root` (its
    device tree's ``proc/device-tree/compatible``)."""
    try:
        _import_rknnlite()
    except RuntimeUnavailable as exc:
        return RuntimeInfo(name=KEY, available=False, reason=str(exc))
    platform = host_platform(root / COMPATIBLE.relative_to("/"))
    if platform is None:
        return RuntimeInfo(name=KEY, available=False, reason="rknnlite imports, but this is no RK3588/RK3566/RK3568")
    return RuntimeInfo(name=KEY, available=True, version=_version(), devices=(f"{platform.upper()} NPU",))


def _version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("rknn-toolkit-lite2")
    except metadata.PackageNotFoundError:
        return None


class RKNNBackend(Runtime):
    """An ``.rknn`` model on the NPU through one RKNNLite context, one call at a time."""

    name = KEY

    def __init__(self, model_path: Path, record: RKNNRecord, config: RKNNConfig, warmup: bool = True) -> None:
        super().__init__(model_path)
        platform = host_platform()
        check_target(record, model_path, platform)
        rknnlite = _import_rknnlite()
        lite = rknnlite(verbose=False)
        if lite.load_rknn(str(model_path)) != 0:
            lite.release()
            raise ModelLoadError(f"RKNNLite cannot load {model_path.name} (load_rknn failed; its log says why)")
        # only the RK3588 (three cores) takes a core mask; the single-core SoCs refuse one
        extra = {"core_mask": CORE_MASKS[config.core_mask]} if platform == "rk3588" else {}
        if lite.init_runtime(**extra) != 0:
            lite.release()
            raise ModelLoadError(
                f"RKNNLite cannot start {model_path.name} on the {platform} NPU (init_runtime failed; "
                "is librknnrt.so the toolkit's release? docs/rknn.md)"
            )
        self._lite: Any = lite
        self.record = record
        self.inputs = [_spec(s) for s in record.inputs]
        self.outputs = [_spec(s) for s in record.outputs]
        self.metadata = parse_metadata(record.metadata)
        self._device = f"{platform.upper() if platform else 'RKNN'} NPU"
        if warmup:
            self.warmup()

    @property
    def device(self) -> str:
        return self._device

    def close(self) -> None:
        if self._lite is not None:
            self._lite.release()
            self._lite = None

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        check_inputs(self.inputs, arrays)
        lite = self._lite
        if lite is None:
            raise InferenceError(f"{self.model_path.name} was closed")
        # the pipeline's tensors are the ONNX model's (NCHW images): RKNNLite takes images as NHWC
        given = [
            np.ascontiguousarray(a.transpose(0, 2, 3, 1) if spec.layout == "NCHW" else a)
            for spec, a in zip(self.inputs, arrays, strict=True)
        ]
        try:
            result = lite.inference(inputs=given, data_format="nhwc")
        except Exception as exc:
            raise InferenceError(f"RKNNLite failed on {self.model_path.name}: {type(exc).__name__}: {exc}") from exc
        if result is None or len(result) != len(self.outputs):
            got = "nothing" if result is None else f"{len(result)} outputs"
            raise InferenceError(f"RKNNLite returned {got} for {self.model_path.name} ({len(self.outputs)} expected)")
        return [
            np.asarray(r, dtype=np.float32).reshape(_shape(spec, r))
            for spec, r in zip(self.outputs, result, strict=True)
        ]


def _shape(spec: TensorSpec, value: Any) -> tuple[int, ...]:
    """The ONNX output's shape for RKNNLite's array (its dynamic axes from the array's size)."""
    if None not in spec.shape:
        return tuple(int(d) for d in spec.shape if d is not None)
    return tuple(np.shape(value))


def load(model_path: Path, config: RKNNConfig, options: LoadOptions) -> RKNNBackend:
    """The registry's loader: an ``.rknn`` model and its record, converted for this board's SoC
    (`RuntimeUnavailable` first where rknnlite does not import)."""
    _import_rknnlite()
    if not model_path.is_file():
        raise ModelLoadError(f"model file not found: {model_path}")
    if model_path.suffix != ".rknn":
        raise ModelLoadError(f"{model_path.name}: the rknn runtime loads .rknn models (bundle build --rknn)")
    return RKNNBackend(model_path, RKNNRecord.read(model_path), config, options.warmup)


def candidates(config: RKNNConfig, model: BundleModel, info: RuntimeInfo, variants: bool) -> list[TuneCandidate]:
    """One row: the model on this board's NPU, or why not: ``TARGET_MISMATCH`` first for another
    SoC's (whether or not rknnlite imports here), else why the backend is unavailable."""
    why = None
    try:
        check_target(RKNNRecord.read(model.path), model.path, host_platform())
    except ModelLoadError as exc:
        why = str(exc)
    if why is None and not info.available:
        why = info.reason or "unavailable"
    device = info.devices[0] if info.devices else "NPU"
    return [TuneCandidate(device, model.precision, config, unavailable=why)]


def write_record(onnx_model: Path, out: Path, platform: str, toolkit_version: str, quantization: str) -> RKNNRecord:
    """The record beside the ``.rknn`` `out` converted from `onnx_model` for `platform`: the ONNX
    model's inputs, outputs and metadata as ONNX Runtime reads them (its decoding is theirs)."""
    from runtimes.files import atomic_write, sha256_file
    from runtimes.registry import load_runtime

    with load_runtime("onnxruntime", onnx_model, warmup=False) as reference:
        inputs, outputs, raw = reference.inputs, reference.outputs, dict(reference.metadata.raw)
    record = RKNNRecord(
        platform=platform,
        toolkit_version=toolkit_version,
        quantization=quantization,
        model_sha256=sha256_file(onnx_model),
        inputs=[spec_json(s) for s in inputs],
        outputs=[spec_json(s) for s in outputs],
        metadata=raw,
    )
    atomic_write(out.with_name(out.name + RECORD_SUFFIX), record.to_json())
    return record
