"""`Detector`: a loaded `Runtime` plus the preprocessing and decoding its model needs.

``Detector(runtime).detect(frame)`` takes a BGR ``(H, W, 3) uint8`` frame and returns
`Detections` in that frame's pixels, clipped to it, highest confidence first.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from pipelines.decoders import CONVENTIONS, DECODERS, DecoderError, DecoderName, choose_decoder
from pipelines.detections import Detections
from pipelines.nms import class_aware_nms
from pipelines.preprocess import PreprocessConfig, Transform, preprocess
from runtimes.base import Quantization, Runtime, TensorSpec, dequantize

log = logging.getLogger(__name__)

#: input size used when the model's input is dynamic and its metadata names none
DEFAULT_INPUT_SIZE = 640


def _image_input(runtime: Runtime) -> TensorSpec:
    images = [spec for spec in runtime.inputs if spec.layout is not None]
    if len(runtime.inputs) != 1 or not images:
        shapes = ", ".join(f"{s.name}{s.shape}" for s in runtime.inputs)
        raise DecoderError(f"expected a model with one image input (N, 3, H, W) or (N, H, W, 3), found {shapes}")
    return images[0]


def _input_size(spec: TensorSpec, runtime: Runtime) -> tuple[int, int]:
    h, w = spec.image_hw
    if h is not None and w is not None:
        return h, w
    imgsz = runtime.metadata.imgsz or (DEFAULT_INPUT_SIZE, DEFAULT_INPUT_SIZE)
    return h or imgsz[0], w or imgsz[1]


def _input_quantization(spec: TensorSpec, mean: float, std: float) -> Quantization | None:
    """The model's own quantization, or for an integer input without one: raw pixels."""
    if not np.issubdtype(spec.dtype, np.integer):
        return None
    if spec.quantization is not None:
        return spec.quantization
    # q = x / scale + zp with x = (p - mean) / std  ->  q = p (uint8) or p - 128 (int8)
    zero_point = round(mean) - (128 if spec.dtype == np.int8 else 0)
    return Quantization(scale=1.0 / std, zero_point=zero_point)


def _output_shapes(runtime: Runtime, config: PreprocessConfig) -> list[tuple[int, ...]]:
    """The outputs' shapes for one image: from the specs when only the batch axis is open, else
    from a run on a grey frame (dynamic exports leave the anchor count open)."""
    specs = [spec.shape for spec in runtime.outputs]
    if all(d is not None for shape in specs for d in shape[1:]):
        return [tuple(1 if d is None else d for d in shape) for shape in specs]
    grey = np.full((*config.size, 3), 114, np.uint8)
    return [tuple(o.shape) for o in runtime.infer([preprocess(grey, config)[0]])]


class FrameDetector(Protocol):
    """What a pipeline needs of a detector: a `Detector`, or a camera's hold on a model shared
    with other cameras (`pipelines.shared_model.CameraModel`). `close` ends this user's hold:
    a `Detector` closes its runtime."""

    @property
    def runtime(self) -> Runtime: ...

    def prepare(self, frame: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], Transform]: ...

    def infer(self, tensor: npt.NDArray[Any]) -> list[npt.NDArray[Any]]: ...

    def postprocess(self, outputs: list[npt.NDArray[Any]], transform: Transform) -> Detections: ...

    def close(self) -> None: ...


class Detector:
    """Runs one detection model on frames.

    `decoder` ``"auto"`` picks the decoder from the output shapes and metadata (the reason is in
    `decoder_reason`). `conf` is the score threshold (0..1), `iou` the NMS overlap threshold,
    `max_det` the most detections kept per frame.
    """

    def __init__(
        self,
        runtime: Runtime,
        decoder: DecoderName | str = "auto",
        conf: float = 0.25,
        iou: float = 0.45,
        max_det: int = 300,
    ) -> None:
        if not 0.0 <= conf <= 1.0:
            raise ValueError(f"conf must be within 0..1, got {conf}")
        if not 0.0 <= iou <= 1.0:
            raise ValueError(f"iou must be within 0..1, got {iou}")
        if max_det < 1:
            raise ValueError(f"max_det must be at least 1, got {max_det}")
        self.runtime = runtime
        self.conf, self.iou, self.max_det = conf, iou, max_det
        spec = _image_input(runtime)
        self.input_hw = _input_size(spec, runtime)
        layout = spec.layout or "NCHW"
        probe_config = PreprocessConfig(
            size=self.input_hw, layout=layout, dtype=spec.dtype, quantization=_input_quantization(spec, 0.0, 255.0)
        )
        shapes = _output_shapes(runtime, probe_config)
        if decoder == "auto":
            names = runtime.metadata.names
            self.decoder, self.decoder_reason = choose_decoder(shapes, self.input_hw, len(names) if names else None)
        elif decoder in DECODERS:
            self.decoder, self.decoder_reason = decoder, "chosen by configuration"
        else:
            raise DecoderError(f"unknown decoder {decoder!r}; known: auto, {', '.join(DECODERS)}")
        convention = CONVENTIONS[self.decoder]
        dynamic = None in spec.image_hw
        self.preprocess_config = replace(
            probe_config,
            resize=convention.resize,
            color=convention.color,
            mean=convention.mean,
            std=convention.std,
            quantization=_input_quantization(spec, convention.mean, convention.std),
            rect_stride=(runtime.metadata.stride or 32) if dynamic and convention.resize == "letterbox" else None,
        )
        log.info("decoder %s: %s", self.decoder, self.decoder_reason)

    def prepare(self, frame: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], Transform]:
        """Preprocess a BGR ``(H, W, 3) uint8`` frame into the model's input tensor."""
        return preprocess(frame, self.preprocess_config)

    def infer(self, tensor: npt.NDArray[Any], runtime: Runtime | None = None) -> list[npt.NDArray[Any]]:
        """Run the model; outputs come back dequantized to float32. `runtime` is another runtime
        on the same model (a serving thread's own, `Runtime.for_worker`); default: this one's."""
        raw = (runtime or self.runtime).infer([tensor])
        return [dequantize(array, spec) for array, spec in zip(raw, self.runtime.outputs, strict=True)]

    def postprocess(self, outputs: list[npt.NDArray[Any]], transform: Transform) -> Detections:
        """Decode, NMS, and map boxes to frame pixels (clipped; boxes left empty are dropped)."""
        candidates = DECODERS[self.decoder](outputs, transform.input_hw, self.conf)
        kept = class_aware_nms(candidates, self.iou, self.max_det)
        xyxy = transform.to_source(kept.xyxy)
        visible = (xyxy[:, 2] > xyxy[:, 0]) & (xyxy[:, 3] > xyxy[:, 1])
        return Detections(xyxy, kept.confidence, kept.class_id)[visible]

    def close(self) -> None:
        """Close the runtime (the detector is done serving)."""
        self.runtime.close()

    def detect(self, frame: npt.NDArray[Any]) -> Detections:
        """Detect objects in one BGR ``(H, W, 3) uint8`` frame; boxes in frame pixels."""
        tensor, transform = self.prepare(frame)
        return self.postprocess(self.infer(tensor), transform)
