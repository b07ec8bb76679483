"""A test double of HailoRT's Python API (``hailo_platform``), the part `runtimes.hailo_backend`
uses, where HailoRT cannot be installed (it needs Hailo's driver and a chip).

Names, parameters and behaviour follow ``hailo-ai/hailort``'s
``hailort/libhailort/bindings/python/platform/hailo_platform/pyhailort/pyhailort.py`` at v4.18.0
and v5.2.0 (the InferModel API, in both) and the pybind11 bindings beside it
(``bindings_common.hpp``'s ``get_pybind_shape``: an input or output is ``(H, W, C)``, an
``NHW`` output ``(H, W)``, an NMS output the flat size of its per-class buffer);
``API`` lists the signatures as read, and tests/runtimes/test_hailo_backend_double.py checks this module
against it. Use it with `installed` (``sys.modules["hailo_platform"]``).

What the double does:

- `HEF` reads a HEF made by `write_hef`: HailoRT's real header (magic, version 0, the
  protobuf's size, ``ProtoHEFHef.header.hw_arch``) and, in a protobuf field HailoRT ignores,
  the double's own description: the ONNX model it stands for, the input quantization and the
  normalisation compiled in, and the output form (raw, or NMS on the chip with its thresholds).
- `VDevice` is a chip of `DEVICE_ARCH` (``hailo8l`` unless a test sets it); creating an
  InferModel of a HEF compiled for another chip raises `HailoRTHEFNotCompatibleWithDevice`, as
  HailoRT's ``Hef::get_compatible_device_archs`` check does.
- ``ConfiguredInferModel.run`` dequantizes the uint8 input with the HEF's ``quant_infos``,
  applies the compiled-in normalisation, runs the ONNX model with ONNX Runtime (NCHW), and
  writes each output: raw ones as they are (FLOAT32) or quantized to UINT8 (the default type);
  the NMS one in HailoRT's ``HAILO_NMS_BY_CLASS`` layout (per class: the count, then
  ``y_min, x_min, y_max, x_max, score`` per box, normalised), made by its own per-class greedy
  NMS; ``get_buffer()`` returns it per class as pyhailort's
  ``output_raw_buffer_to_nms_format_single_frame`` does.
"""

from __future__ import annotations

import enum
import json
import struct
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import onnxruntime as ort

__version__ = "4.23.0"
#: the chip every VDevice is (a test sets ``hailo10h`` for an AI HAT+ 2)
DEVICE_ARCH = "hailo8l"
BBOX_PARAMS = 5
_MAGIC = 0x01484546
_DOUBLE_FIELD = 15  # ProtoHEFHef has fields 1-7: HailoRT skips an unknown field
#: ProtoHEFHwArch (hef.proto) values, and the devices each runs on (device_internal.cpp)
HW_ARCH_VALUES = {"hailo8": 0, "hailo8l": 3, "hailo1xh": 103}
_RUNS_ON = {"hailo8": {"hailo8"}, "hailo8l": {"hailo8l", "hailo8"}, "hailo1xh": {"hailo15h", "hailo10h"}}

#: the signatures of the API as read (pyhailort.py v4.18.0 and v5.2.0), by qualified name; a
#: tuple where the releases differ: the double takes the 5.2 names, the backend passes positionally
API: dict[str, str | tuple[str, str]] = {
    "HEF.__init__": "(self, hef_source)",
    "HEF.get_input_vstream_infos": "(self, name=None)",
    "HEF.get_output_vstream_infos": "(self, name=None)",
    "VDevice.__init__": "(self, params=None, *, device_ids=None)",
    "VDevice.create_params": "()",
    "VDevice.create_infer_model": ("(self, hef_source, network_name='')", "(self, hef_source, name='')"),
    "VDevice.release": "(self)",
    "InferModel.set_batch_size": "(self, batch_size)",
    "InferModel.configure": "(self)",
    "InferModel.input": "(self, name='')",
    "InferModel.output": "(self, name='')",
    "InferModel.InferStream.set_format_type": "(self, type)",
    "ConfiguredInferModel.create_bindings": "(self, input_buffers=None, output_buffers=None)",
    "ConfiguredInferModel.run": "(self, bindings, timeout)",
    "ConfiguredInferModel.Bindings.input": "(self, name='')",
    "ConfiguredInferModel.Bindings.output": "(self, name='')",
    "ConfiguredInferModel.Bindings.InferStream.set_buffer": "(self, buffer)",
    "ConfiguredInferModel.Bindings.InferStream.get_buffer": "(self, tf_format=False)",
}
#: the properties of the API as read (InferModel's and its InferStream's)
PROPERTIES = {
    "InferModel": ("input_names", "output_names", "inputs", "outputs", "hef"),
    "InferModel.InferStream": ("name", "shape", "format", "quant_infos", "is_nms"),
}


class HailoRTException(Exception):
    """pyhailort's base exception."""


class HailoRTHEFNotCompatibleWithDevice(HailoRTException):
    """A HEF compiled for another chip (pyhailort.py)."""


class HailoRTTimeout(HailoRTException):
    pass


class FormatType(enum.Enum):
    """``_pyhailort.FormatType`` (pyhailort.cpp): its ``str`` is ``FormatType.UINT8``."""

    AUTO = 0
    UINT8 = 1
    UINT16 = 2
    FLOAT32 = 3


class FormatOrder(enum.Enum):
    """The orders the double uses (5.x names: 4.x calls HAILO_NMS_BY_CLASS ``HAILO_NMS``)."""

    NHWC = 1
    NHW = 2
    NC = 3
    HAILO_NMS_BY_CLASS = 4


_NUMPY = {FormatType.UINT8: np.uint8, FormatType.UINT16: np.uint16, FormatType.FLOAT32: np.float32}


@dataclass
class QuantInfo:
    """``hailo_quant_info_t``: ``real = (q - qp_zp) * qp_scale``."""

    qp_zp: float
    qp_scale: float
    limvals_min: float = 0.0
    limvals_max: float = 0.0


@dataclass
class Format:
    """``hailo_format_t``."""

    type: FormatType
    order: FormatOrder
    flags: int = 0


@dataclass
class NmsShape:
    """``hailo_nms_shape_t``."""

    number_of_classes: int
    max_bboxes_per_class: int


@dataclass
class VStreamInfo:
    """``_pyhailort.VStreamInfo``: the HEF's view of a stream."""

    name: str
    shape: tuple[int, ...]
    format: Format
    quant_info: QuantInfo
    nms_shape: NmsShape | None = None


# -- the HEF file ---------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def write_hef(
    path: Path,
    onnx_model: Path,
    hw_arch: str = "hailo8l",
    nms: bool = False,
    input_scale: float = 1 / 255,
    normalisation_in_hef: bool = False,
    nms_score: float = 0.25,
    nms_iou: float = 0.7,
    max_bboxes_per_class: int = 100,
    header_version: int = 0,
    sdk_version: str | None = "3.31.0",
) -> Path:
    """A HEF the double runs: HailoRT's header (``hw_arch``, ``sdk_version``: the Dataflow
    Compiler release), and the double's description. `input_scale` is the input's ``qp_scale``
    (1/255: the model's normalised input; 1.0 with `normalisation_in_hef`: pixels, divided by 255
    inside, as the Model Zoo compiles them)."""
    header_message = _varint(1 << 3 | 0) + _varint(HW_ARCH_VALUES[hw_arch]) if HW_ARCH_VALUES[hw_arch] else b""
    if sdk_version is not None:
        header_message += _field(3, sdk_version.encode())
    description = {
        "onnx": str(onnx_model),
        "nms": nms,
        "input_scale": input_scale,
        "normalisation_in_hef": normalisation_in_hef,
        "nms_score": nms_score,
        "nms_iou": nms_iou,
        "max_bboxes_per_class": max_bboxes_per_class,
    }
    proto = _field(1, header_message) + _field(_DOUBLE_FIELD, json.dumps(description).encode())
    distinct = {0: 20, 1: 16, 2: 32, 3: 44}[header_version]
    path.write_bytes(struct.pack(">III", _MAGIC, header_version, len(proto)) + bytes(distinct) + proto + b"\0" * 64)
    return path


def _read_hef(path: str) -> tuple[str, dict[str, Any]]:
    data = Path(path).read_bytes()
    magic, version, size = struct.unpack(">III", data[:12])
    if magic != _MAGIC:
        raise HailoRTException(f"HEF magic does not match: {magic:x}")
    start = {0: 32, 1: 28, 2: 44, 3: 56}[version]
    proto, pos, found = data[start : start + size], 0, {}
    while pos < len(proto):  # two length-delimited fields, each of one-byte key and varint size
        number = proto[pos] >> 3
        pos += 1
        length = shift = 0
        while True:
            byte = proto[pos]
            pos += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        found[number] = proto[pos : pos + length]
        pos += length
    header = found.get(1, b"")
    # hw_arch (field 1, a one-byte varint: every value used is < 128) comes first; absent when 0
    value = header[1] if len(header) >= 2 and header[0] == 1 << 3 else 0
    arch = {v: k for k, v in HW_ARCH_VALUES.items()}[value]
    return arch, json.loads(found[_DOUBLE_FIELD])


class HEF:
    """``HEF(hef_source)``: a path (str) or the bytes of a HEF."""

    def __init__(self, hef_source: Any) -> None:
        if not isinstance(hef_source, str):
            raise ValueError("HEF can only be created from a file path (str) or a buffer (bytes)")
        self._path = hef_source
        self.hw_arch, self._description = _read_hef(hef_source)
        self._session = ort.InferenceSession(self._description["onnx"], providers=["CPUExecutionProvider"])
        model_input = self._session.get_inputs()[0]
        _, channels, height, width = model_input.shape
        scale = float(self._description["input_scale"])
        self._inputs = [
            VStreamInfo(
                "hef/input_layer1",
                (int(height), int(width), int(channels)),
                Format(FormatType.UINT8, FormatOrder.NHWC),
                QuantInfo(0.0, scale),
            )
        ]
        output = self._session.get_outputs()[0]
        # a compiled network has fixed shapes: the ONNX model's at batch 1 (its axes may be dynamic)
        zeros = np.zeros((1, int(channels), int(height), int(width)), np.float32)
        fixed = self._session.run(None, {model_input.name: zeros})[0].shape
        if self._description["nms"]:
            classes = int(fixed[1]) - 4
            nms_shape = NmsShape(classes, int(self._description["max_bboxes_per_class"]))
            self._outputs = [
                VStreamInfo(
                    "hef/yolov8_nms_postprocess",
                    (classes * (1 + BBOX_PARAMS * nms_shape.max_bboxes_per_class),),
                    Format(FormatType.FLOAT32, FormatOrder.HAILO_NMS_BY_CLASS),
                    QuantInfo(0.0, 1.0),
                    nms_shape,
                )
            ]
        else:
            shape = tuple(int(d) for d in fixed[1:])
            self._outputs = [
                VStreamInfo(
                    f"hef/{output.name}", shape, Format(FormatType.UINT8, FormatOrder.NHW), QuantInfo(0.0, 1 / 255)
                )
            ]

    @property
    def path(self) -> str:
        return self._path

    def get_input_vstream_infos(self, name: str | None = None) -> list[VStreamInfo]:
        return list(self._inputs)

    def get_output_vstream_infos(self, name: str | None = None) -> list[VStreamInfo]:
        return list(self._outputs)


# -- the device and the InferModel API --------------------------------------------------------


class VDeviceParams:
    """``_pyhailort.VDeviceParams.default()``."""

    scheduling_algorithm: Any = None


class VDevice:
    """A virtual device of one chip of `DEVICE_ARCH`."""

    opened: ClassVar[list[VDevice]] = []

    def __init__(self, params: VDeviceParams | None = None, *, device_ids: list[str] | None = None) -> None:
        if params is not None and device_ids is not None:
            raise HailoRTException("params and device_ids exclude each other")
        self.arch = DEVICE_ARCH
        self.released = False
        VDevice.opened.append(self)

    @staticmethod
    def create_params() -> VDeviceParams:
        return VDeviceParams()

    def create_infer_model(self, hef_source: str, name: str = "") -> InferModel:
        if self.released:
            raise HailoRTException("the VDevice was released")
        hef = HEF(hef_source)
        if self.arch not in _RUNS_ON[hef.hw_arch]:
            raise HailoRTHEFNotCompatibleWithDevice(
                f"HEF format is not compatible with device. Device arch: {self.arch.upper()}, "
                f"HEF arch: {hef.hw_arch.upper()}"
            )
        return InferModel(hef)

    def release(self) -> None:
        self.released = True

    def __enter__(self) -> VDevice:
        return self

    def __exit__(self, *args: object) -> None:
        self.release()


class InferModel:
    """``InferModel``: the streams of a HEF, their formats set before `configure`."""

    class InferStream:
        def __init__(self, info: VStreamInfo) -> None:
            self._info = info
            self._type = info.format.type

        @property
        def name(self) -> str:
            return self._info.name

        @property
        def shape(self) -> list[int]:
            return list(self._info.shape)

        @property
        def format(self) -> Format:
            return Format(self._type, self._info.format.order)

        def set_format_type(self, type: FormatType) -> None:  # HailoRT names it type
            if not isinstance(type, FormatType):
                raise HailoRTException(f"expected a FormatType, got {type!r}")
            self._type = type

        @property
        def quant_infos(self) -> list[QuantInfo]:
            return [self._info.quant_info]

        @property
        def is_nms(self) -> bool:
            return self._info.format.order is FormatOrder.HAILO_NMS_BY_CLASS

    def __init__(self, hef: HEF) -> None:
        self._hef = hef
        self._inputs = {i.name: self.InferStream(i) for i in hef.get_input_vstream_infos()}
        self._outputs = {o.name: self.InferStream(o) for o in hef.get_output_vstream_infos()}
        self.batch_size = 0

    @property
    def hef(self) -> HEF:
        return self._hef

    def set_batch_size(self, batch_size: int) -> None:
        self.batch_size = batch_size

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self._outputs)

    @property
    def inputs(self) -> list[InferModel.InferStream]:
        return list(self._inputs.values())

    @property
    def outputs(self) -> list[InferModel.InferStream]:
        return list(self._outputs.values())

    def input(self, name: str = "") -> InferModel.InferStream:
        return _named(self._inputs, name)

    def output(self, name: str = "") -> InferModel.InferStream:
        return _named(self._outputs, name)

    def configure(self) -> ConfiguredInferModel:
        return ConfiguredInferModel(self)


def _named(streams: dict[str, Any], name: str) -> Any:
    if name == "" and len(streams) == 1:
        return next(iter(streams.values()))
    if name not in streams:
        raise HailoRTException(f"HAILO_NOT_FOUND: no stream {name!r}")
    return streams[name]


class ConfiguredInferModel:
    """``ConfiguredInferModel``: bindings and a synchronous `run`."""

    class Bindings:
        class InferStream:
            def __init__(self, stream: InferModel.InferStream, nms: NmsShape | None) -> None:
                self._stream = stream
                self._nms = nms
                self._buffer: np.ndarray | None = None

            def set_buffer(self, buffer: np.ndarray) -> None:
                if not buffer.flags.c_contiguous:
                    raise HailoRTException("Buffer must be C_CONTIGUOUS")
                want = int(np.prod(self._stream.shape)) * np.dtype(_NUMPY[self._stream.format.type]).itemsize
                if buffer.nbytes != want:
                    raise HailoRTException(f"HAILO_INVALID_ARGUMENT: buffer of {buffer.nbytes} bytes, expected {want}")
                self._buffer = buffer

            def get_buffer(self, tf_format: bool = False) -> Any:
                if self._nms is None or tf_format is None:
                    return self._buffer
                if tf_format:
                    raise HailoRTException("the double gives NMS outputs in Hailo's format only")
                raw, offset, frame = self._buffer, 0, []
                assert raw is not None
                for _ in range(self._nms.number_of_classes):  # output_raw_buffer_to_nms_format_single_frame
                    count = int(raw[offset])
                    offset += 1
                    if count == 0:
                        frame.append(np.empty([0, BBOX_PARAMS]))
                    else:
                        frame.append(raw[offset : offset + BBOX_PARAMS * count].reshape(count, BBOX_PARAMS))
                        offset += BBOX_PARAMS * count
                return frame

        def __init__(self, model: InferModel) -> None:
            infos = {o.name: o.nms_shape for o in model.hef.get_output_vstream_infos()}
            self._inputs = {s.name: self.InferStream(s, None) for s in model.inputs}
            self._outputs = {s.name: self.InferStream(s, infos[s.name]) for s in model.outputs}

        def input(self, name: str = "") -> ConfiguredInferModel.Bindings.InferStream:
            return _named(self._inputs, name)

        def output(self, name: str = "") -> ConfiguredInferModel.Bindings.InferStream:
            return _named(self._outputs, name)

    def __init__(self, model: InferModel) -> None:
        self._model: InferModel | None = model
        self.runs = 0

    def __enter__(self) -> ConfiguredInferModel:
        return self

    def __exit__(self, *args: object) -> None:
        self._model = None

    def create_bindings(
        self, input_buffers: dict[str, np.ndarray] | None = None, output_buffers: dict[str, np.ndarray] | None = None
    ) -> ConfiguredInferModel.Bindings:
        if self._model is None:
            raise HailoRTException("the ConfiguredInferModel was released")
        bindings = self.Bindings(self._model)
        for name, buffer in (input_buffers or {}).items():
            bindings.input(name).set_buffer(buffer)
        for name, buffer in (output_buffers or {}).items():
            bindings.output(name).set_buffer(buffer)
        return bindings

    def run(self, bindings: list[ConfiguredInferModel.Bindings], timeout: int) -> None:
        model = self._model
        if model is None:
            raise HailoRTException("the ConfiguredInferModel was released")
        if not isinstance(bindings, list) or not isinstance(timeout, int):
            raise HailoRTException("run takes a list of bindings and a timeout in milliseconds")
        hef, description = model.hef, model.hef._description
        for binding in bindings:
            stream = binding.input()
            pixels = stream._buffer
            if pixels is None:
                raise HailoRTException("HAILO_INVALID_OPERATION: the input buffer is not set")
            quant = stream._stream.quant_infos[0]
            real = (pixels.reshape(stream._stream.shape).astype(np.float32) - quant.qp_zp) * np.float32(quant.qp_scale)
            if description["normalisation_in_hef"]:
                real = real / np.float32(255.0)
            (out,) = hef._session.run(None, {hef._session.get_inputs()[0].name: real.transpose(2, 0, 1)[None]})
            (name,) = model.output_names
            target = binding.output(name)
            if target._buffer is None:
                raise HailoRTException("HAILO_INVALID_OPERATION: the output buffer is not set")
            if target._nms is not None:
                target._buffer[...] = _by_class(out[0], target._nms, description, hef._inputs[0].shape[:2])
            elif target._stream.format.type is FormatType.FLOAT32:
                target._buffer[...] = out[0].reshape(target._buffer.shape)
            else:
                q = target._stream.quant_infos[0]
                values = np.clip(np.rint(out[0] / q.qp_scale + q.qp_zp), 0, 255)
                target._buffer[...] = values.astype(np.uint8).reshape(target._buffer.shape)
            self.runs += 1


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    y0 = np.maximum(box[0], others[:, 0])
    x0 = np.maximum(box[1], others[:, 1])
    y1 = np.minimum(box[2], others[:, 2])
    x1 = np.minimum(box[3], others[:, 3])
    inter = np.clip(y1 - y0, 0, None) * np.clip(x1 - x0, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-12)


def _by_class(out: np.ndarray, shape: NmsShape, description: dict[str, Any], input_hw: tuple[int, ...]) -> np.ndarray:
    """YOLOv8's ``(4+nc, N)`` output through the double's own NMS, in ``HAILO_NMS_BY_CLASS``."""
    height, width = input_hw
    cx, cy, w, h = out[0], out[1], out[2], out[3]
    if max(float(np.abs(out[:4]).max()), 0.0) > 2.0:  # boxes in input pixels: normalise them
        cx, cy, w, h = cx / width, cy / height, w / width, h / height
    boxes = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)
    flat: list[float] = []
    for class_id in range(shape.number_of_classes):
        scores = out[4 + class_id]
        order = np.flatnonzero(scores > description["nms_score"])
        order = order[np.argsort(-scores[order], kind="stable")]
        kept: list[int] = []
        while len(order) and len(kept) < shape.max_bboxes_per_class:
            best, order = order[0], order[1:]
            kept.append(int(best))
            order = order[_iou(boxes[best], boxes[order]) <= description["nms_iou"]]
        flat.append(float(len(kept)))
        for i in kept:
            flat.extend([*boxes[i].tolist(), float(scores[i])])
    result = np.zeros(shape.number_of_classes * (1 + BBOX_PARAMS * shape.max_bboxes_per_class), np.float32)
    result[: len(flat)] = flat
    return result


@contextmanager
def installed(device_arch: str = "hailo8l", version: str = "4.23.0") -> Iterator[ModuleType]:
    """This module as ``hailo_platform`` (its chip `device_arch`, its version `version`) for the
    length of the block."""
    global DEVICE_ARCH, __version__
    module = sys.modules[__name__]
    saved = sys.modules.get("hailo_platform"), DEVICE_ARCH, __version__
    DEVICE_ARCH, __version__ = device_arch, version
    sys.modules["hailo_platform"] = module
    try:
        yield module
    finally:
        DEVICE_ARCH, __version__ = saved[1], saved[2]
        if saved[0] is None:
            sys.modules.pop("hailo_platform", None)
        else:
            sys.modules["hailo_platform"] = saved[0]
