"""Hailo backend (`runtime: hailo`, format ``hef``): a HEF compiled by Hailo's Dataflow Compiler
for the chip, run by HailoRT's Python API (``hailo_platform``) on a Hailo-8 / 8L (the Raspberry
Pi AI HAT+, HailoRT 4.x) or a Hailo-10H (the AI HAT+ 2, HailoRT 5.x).

The API used is HailoRT's InferModel API (``VDevice.create_infer_model``, ``InferModel.configure``,
``ConfiguredInferModel.create_bindings`` and ``run``): documented alike by HailoRT 4.18-4.23 and
5.0-5.2 (``hailort/libhailort/bindings/python/platform/hailo_platform/pyhailort/pyhailort.py``
of ``hailo-ai/hailort`` at those tags), and the one Frigate's ``detectors/plugins/hailo8l.py``
uses. (``InferVStreams`` is in both too, but 5.x's examples and Frigate moved to InferModel.)
Only what both releases have is called: names passed positionally where 4.18 and 5.2 name a
parameter differently (``create_infer_model``'s ``network_name`` / ``name``), NMS outputs told
by ``InferStream.is_nms`` (4.x's format order ``HAILO_NMS`` is 5.x's ``HAILO_NMS_BY_CLASS``).

- Target: the HEF's ``hw_arch`` (its header, `runtimes.hailo_device.hef_hw_arch`) against the
  chip of ``/dev/hailo0`` (its PCIe id in sysfs) before HailoRT opens anything: a Hailo-8 HEF
  on a Hailo-10H, or the reverse, is `TargetMismatch` (``TARGET_MISMATCH``) naming both.
  HailoRT's own refusal at configure (``HailoRTHEFNotCompatibleWithDevice``: a Hailo-8 HEF on a
  Hailo-8L, which share a PCIe id) is reported the same way.
- Input: the HEF's input stream, ``(H, W, C)`` of its format type (UINT8 on every Model Zoo
  HEF), served as ``(1, H, W, C)``. Its quantization (``quant_infos[0]``: ``qp_scale``,
  ``qp_zp``) says what the uint8 stands for: a HEF compiled from the model as exported takes the
  model's normalised input (scale about 1/255), and the spec carries that quantization so the
  preprocessing quantizes into it; a HEF with the normalisation compiled in (the Model Zoo's
  ``normalization`` layer: scale about 1, the real input is pixels) takes raw pixels.
- Outputs, both forms HailoRT gives (each set to FLOAT32: HailoRT dequantizes on the host):
  raw outputs (``(1, *shape)``, for the decoders the ONNX model of the same outputs would get),
  and NMS on the chip (``is_nms``): per class a list of ``[y_min, x_min, y_max, x_max, score]``
  boxes normalised to the input, as ``get_buffer()`` returns them (and Frigate reads them),
  turned into Ultralytics' end-to-end rows ``(1, 300, 6)``: ``x1, y1, x2, y2`` in input pixels,
  score, class; the metadata then says ``end2end`` so the ``end2end`` decoder reads them.
- Metadata: a HEF carries no class names; its record beside it (``model.hef.json``, `HEFRecord`,
  written by ``bundle build --hef``: the chip and compiler release from the header, the sha256
  of the ONNX model it was compiled from, that model's metadata as ONNX Runtime reads it) gives
  them, else the model has none.

Threads: one configured model serves one call at a time (`concurrent` False). ``hailo_platform``
is imported only inside `availability`, `load` and `candidates`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from runtimes.base import (
    BundleModel,
    InferenceError,
    LoadOptions,
    ModelLoadError,
    Quantization,
    Runtime,
    RuntimeInfo,
    RuntimeUnavailable,
    TensorSpec,
    TuneCandidate,
    check_inputs,
    first_line,
)
from runtimes.files import FileTooLarge, read_at_most
from runtimes.hailo_device import (
    HailoDevice,
    TargetMismatch,
    check_target,
    find_devices,
    hef_hw_arch,
    read_hef_header,
    runs_on_family,
    target_mismatch,
)
from runtimes.hailo_settings import KEY as KEY
from runtimes.hailo_settings import HailoConfig as HailoConfig
from runtimes.metadata import parse_metadata

log = logging.getLogger(__name__)

_INSTALL = "install HailoRT and its Python wheel (hailo_platform) for this chip: docs/hailo.md"
#: the suffix of a HEF's record, beside it (``model.hef.json``)
RECORD_SUFFIX = ".json"
MAX_RECORD_BYTES = 1 << 20
#: the end-to-end rows an NMS output is turned into (Ultralytics' ``(1, 300, 6)``)
END2END_ROWS = 300
#: values per box in HailoRT's NMS output: y_min, x_min, y_max, x_max, score (pyhailort's BBOX_PARAMS)
BBOX_PARAMS = 5
#: an input quantization scale above this means the real input is pixels (normalisation compiled in)
_PIXEL_SCALE = 0.5
_DTYPES = {"UINT8": np.uint8, "UINT16": np.uint16, "FLOAT32": np.float32}
_NOT_COMPATIBLE = "HailoRTHEFNotCompatibleWithDevice"


def _import_hailo() -> Any:
    try:
        import hailo_platform
    except Exception as exc:  # a wheel without its libhailort raises more than ImportError
        raise RuntimeUnavailable(
            f"hailo_platform does not import ({type(exc).__name__}: {first_line(exc)}); {_INSTALL}"
        ) from exc
    return hailo_platform


def _device(root: Path) -> HailoDevice:
    devices = find_devices(root)
    if not devices:
        raise RuntimeUnavailable(
            "no Hailo device: no /dev/hailo* (is the AI HAT+ seated and the hailo_pci driver loaded? docs/hailo.md)"
        )
    return devices[0]


def availability(root: Path = Path("/")) -> RuntimeInfo:
    """Whether hailo_platform imports here and a Hailo chip is present under `root` (``dev/hailo*``
    and sysfs: `runtimes.hailo_device.find_devices`): its version and chip."""
    try:
        hailo = _import_hailo()
        device = _device(root)
    except RuntimeUnavailable as exc:
        return RuntimeInfo(name=KEY, available=False, reason=str(exc))
    return RuntimeInfo(name=KEY, available=True, version=str(hailo.__version__), devices=(device.family,))


@dataclass(frozen=True)
class HEFRecord:
    """A HEF's record, beside it (``model.hef.json``), written by ``bundle build --hef``
    (`write_record`): the chip it was compiled for and the compiler's release, as its header
    says (`runtimes.hailo_device.read_hef_header`), the sha256 of the ONNX model it was compiled
    from (shipped beside it: its reference) and that model's metadata."""

    hw_arch: str
    sdk_version: str | None
    model_sha256: str
    metadata: dict[str, str]

    @classmethod
    def read(cls, hef: Path) -> HEFRecord:
        """The record beside `hef`; `ModelLoadError` when it is missing, too large or not one."""
        doc = _record(hef)
        if doc is None:
            raise ModelLoadError(f"HEF {hef.name} needs its record {hef.name}{RECORD_SUFFIX} beside it")
        try:
            sdk = doc["sdk_version"]
            return cls(
                hw_arch=str(doc["hw_arch"]),
                sdk_version=None if sdk is None else str(sdk),
                model_sha256=str(doc["model_sha256"]),
                metadata=_metadata(doc),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelLoadError(f"{hef.name}{RECORD_SUFFIX} is not a HEF record: {type(exc).__name__}: {exc}") from exc


def write_record(hef: Path, onnx_model: Path) -> HEFRecord:
    """The record beside `hef`, compiled from `onnx_model`: its header read (`NotAModelError`
    naming the file when it is not a HEF), the ONNX model's sha256 and metadata."""
    from runtimes.files import atomic_write, sha256_file
    from runtimes.registry import load_runtime

    header = read_hef_header(hef)
    with load_runtime("onnxruntime", onnx_model, warmup=False) as reference:
        raw = dict(reference.metadata.raw)
    record = HEFRecord(header.hw_arch, header.sdk_version, sha256_file(onnx_model), raw)
    atomic_write(hef.with_name(hef.name + RECORD_SUFFIX), json.dumps(asdict(record), sort_keys=True).encode())
    return record


def read_metadata(hef: Path) -> dict[str, str]:
    """The metadata of the record beside `hef` (``model.hef.json``); none without a record;
    `ModelLoadError` when it is too large or not a record."""
    doc = _record(hef)
    try:
        return {} if doc is None else _metadata(doc)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(f"{hef.name}{RECORD_SUFFIX} is not a HEF record: {type(exc).__name__}: {exc}") from exc


def _record(hef: Path) -> dict[str, Any] | None:
    """The JSON object beside `hef` (``model.hef.json``, read bounded); None when there is none;
    `ModelLoadError` when it is too large, unreadable or not a JSON object."""
    path = hef.with_name(hef.name + RECORD_SUFFIX)
    try:
        data = read_at_most(path, MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except FileTooLarge as exc:
        raise ModelLoadError(str(exc)) from exc
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path.name}: {exc}") from exc
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise ModelLoadError(f"{path.name} is not a HEF record: {type(exc).__name__}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ModelLoadError(f"{path.name} is not a HEF record: a JSON {type(doc).__name__}, not an object")
    return doc


def _metadata(doc: dict[str, Any]) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(doc["metadata"]).items()}


def _format_name(stream: Any) -> str:
    """``UINT8`` of a stream's ``format.type`` (``FormatType.UINT8``, printed as such)."""
    return str(stream.format.type).rsplit(".", 1)[-1]


def input_quantization(scale: float, zero_point: int) -> Quantization | None:
    """What a HEF's uint8 input stands for: the model's normalised input (`Quantization`), or
    pixels (None: raw pixels go in) when the scale says the real range is about 0-255."""
    return None if scale > _PIXEL_SCALE else Quantization(scale=float(scale), zero_point=int(zero_point))


def _input_spec(stream: Any) -> TensorSpec:
    name = _format_name(stream)
    dtype = _DTYPES.get(name)
    shape = tuple(int(d) for d in stream.shape)
    if dtype is None or len(shape) != 3:
        raise ModelLoadError(f"input {stream.name!r}: format {name} of shape {shape}; expected (H, W, C) UINT8")
    quant = stream.quant_infos[0] if stream.quant_infos else None
    quantization = None
    if quant is not None and dtype != np.float32:
        quantization = input_quantization(float(quant.qp_scale), int(quant.qp_zp))
    return TensorSpec(str(stream.name), (1, *shape), np.dtype(dtype), layout="NHWC", quantization=quantization)


def nms_rows(per_class: Sequence[npt.NDArray[Any]], input_hw: tuple[int, int]) -> npt.NDArray[np.float32]:
    """HailoRT's NMS output (per class a ``(n, 5)`` array of normalised ``y_min, x_min, y_max,
    x_max, score``) as end-to-end rows ``(1, END2END_ROWS, 6)``: ``x1, y1, x2, y2`` in input
    pixels, score, class; best first, zeros after."""
    height, width = input_hw
    rows = []
    for class_id, boxes in enumerate(per_class):
        boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, BBOX_PARAMS)
        if len(boxes):
            rows.append(
                np.column_stack(
                    [
                        boxes[:, 1] * width,
                        boxes[:, 0] * height,
                        boxes[:, 3] * width,
                        boxes[:, 2] * height,
                        boxes[:, 4],
                        np.full(len(boxes), class_id, np.float32),
                    ]
                )
            )
    out = np.zeros((1, END2END_ROWS, 6), np.float32)
    if rows:
        found = np.concatenate(rows)
        found = found[np.argsort(-found[:, 4], kind="stable")][:END2END_ROWS]
        out[0, : len(found)] = found
    return out


class HailoBackend(Runtime):
    """A HEF configured on a Hailo chip, one call at a time."""

    name = KEY

    def __init__(
        self, model_path: Path, config: HailoConfig | None = None, warmup: bool = True, root: Path = Path("/")
    ) -> None:
        super().__init__(model_path)
        self.config = config or HailoConfig()
        hailo = _import_hailo()
        arch = hef_hw_arch(model_path)
        device = _device(root)
        check_target(model_path, arch, device)  # before HailoRT opens the device
        raw = read_metadata(model_path)
        self._vdevice: Any = None
        self._configured: Any = None
        try:
            self._vdevice = hailo.VDevice(hailo.VDevice.create_params())
            model = self._vdevice.create_infer_model(str(model_path))
            model.set_batch_size(1)
            if len(model.input_names) != 1:
                raise ModelLoadError(f"{model_path.name} has {len(model.input_names)} inputs; one image input expected")
            self.inputs = [_input_spec(model.input())]
            self._nms: dict[str, bool] = {}
            for name in model.output_names:
                stream = model.output(name)
                stream.set_format_type(hailo.FormatType.FLOAT32)
                self._nms[name] = bool(stream.is_nms)
            self._output_shapes = {name: tuple(int(d) for d in model.output(name).shape) for name in model.output_names}
            self._output_names = list(model.output_names)
            self._configured = model.configure()
        except ModelLoadError:
            self.close()
            raise
        except Exception as exc:  # HailoRT's own exceptions (HailoRTException and its kinds)
            self.close()
            if type(exc).__name__ == _NOT_COMPATIBLE:
                refused = f"HailoRT refuses it on {device.node} ({device.family}): {first_line(exc)}"
                raise TargetMismatch(target_mismatch(model_path, arch, refused)) from exc
            raise ModelLoadError(
                f"HailoRT cannot load {model_path.name}: {type(exc).__name__}: {first_line(exc)}"
            ) from exc
        self.arch, self.chip = arch, device.family
        image = self.inputs[0]
        self.input_hw = (int(image.shape[1] or 0), int(image.shape[2] or 0))
        if any(self._nms.values()):
            raw = {**raw, "end2end": "True"}
            if len(self._output_names) != 1:
                self.close()
                raise ModelLoadError(f"{model_path.name}: an NMS output beside other outputs is not supported")
            self.outputs = [TensorSpec(self._output_names[0], (1, END2END_ROWS, 6), np.dtype(np.float32))]
        else:
            self.outputs = [
                TensorSpec(name, (1, *self._output_shapes[name]), np.dtype(np.float32)) for name in self._output_names
            ]
        raw.setdefault("imgsz", str(list(self.input_hw)))
        self.metadata = parse_metadata(raw)
        if warmup:
            self.warmup()

    @property
    def device(self) -> str:
        return self.chip

    def close(self) -> None:
        configured, self._configured = self._configured, None
        vdevice, self._vdevice = self._vdevice, None
        if configured is not None:
            configured.__exit__(None, None, None)
        if vdevice is not None:
            vdevice.release()

    def infer(self, arrays: Sequence[npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
        check_inputs(self.inputs, arrays)
        configured = self._configured
        if configured is None:
            raise InferenceError(f"{self.model_path.name} was closed")
        try:
            buffers = {name: np.empty(self._output_shapes[name], np.float32) for name in self._output_names}
            bindings = configured.create_bindings(output_buffers=buffers)
            bindings.input().set_buffer(np.ascontiguousarray(arrays[0][0]))
            configured.run([bindings], self.config.timeout_ms)
            results = {name: bindings.output(name).get_buffer() for name in self._output_names}
        except Exception as exc:
            raise InferenceError(
                f"HailoRT failed on {self.model_path.name}: {type(exc).__name__}: {first_line(exc)}"
            ) from exc
        if any(self._nms.values()):
            return [nms_rows(results[self._output_names[0]], self.input_hw)]
        return [
            np.asarray(results[name], np.float32).reshape(1, *self._output_shapes[name]) for name in self._output_names
        ]


def load(model_path: Path, config: HailoConfig, options: LoadOptions) -> HailoBackend:
    """The registry's loader: a HEF on the Hailo chip found under `options.root`."""
    if not model_path.is_file():
        raise ModelLoadError(f"model file not found: {model_path}")
    return HailoBackend(model_path, config, options.warmup, options.root)


def candidates(config: HailoConfig, model: BundleModel, info: RuntimeInfo, variants: bool) -> list[TuneCandidate]:
    """One row: the HEF on the chip the probe found (`info`, under the board's root); why not
    where it was compiled for another chip (``TARGET_MISMATCH``) or the backend is unavailable."""
    family = info.devices[0] if info.devices else None
    why = None if info.available else info.reason or "unavailable"
    if why is None:
        why = target_problem(model.path, family)
    return [TuneCandidate(family or "Hailo", model.precision, config, unavailable=why)]


def target_problem(hef: Path, family: str | None) -> str | None:
    """Why `hef` cannot run on the Hailo chip a probe named `family` (`HailoDevice.family`;
    None: none or an unknown one, left to HailoRT) as ``TARGET_MISMATCH: ...``, or None."""
    try:
        arch = hef_hw_arch(hef)
    except ModelLoadError as exc:
        return str(exc)
    if runs_on_family(arch, family):
        return None
    return target_mismatch(hef, arch, f"this device's chip is {family}")
