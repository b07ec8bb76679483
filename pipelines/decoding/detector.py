"""`Detector`: a loaded `Runtime` plus the preprocessing and decoding its model needs.

``Detector(runtime).detect(frame)`` takes a BGR ``(H, W, 3) uint8`` frame and returns
`Detections` in that frame's pixels, clipped to it, highest confidence first.

Building one runs the model once on a blank (black) frame: the outputs' shapes and content
rank the decoders that could fit (`pipelines.decoding.decoder_choice`), and the plausibility guard
(`pipelines.decoding.plausibility`) keeps the first whose detections are possible. Every decoded frame
passes the guard again: with ``auto`` an implausible frame moves the detector to the next
candidate that reads it plausibly; with a decoder chosen by name it raises `DecoderError`
naming the output shapes and what looked wrong. `postprocess` may run in several inference
threads at once; the switch to another candidate happens under a lock.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from pipelines.decoding.decoder_choice import (
    DECODERS,
    NMS_FREE,
    ROTATED,
    Candidate,
    ModelHints,
    decoder_candidates,
    decoder_for,
)
from pipelines.decoding.decoders import CONVENTIONS, Decode, DecoderError, DecoderName
from pipelines.decoding.detection_filter import DetectionFilter, ThresholdChoice, defaults_for
from pipelines.decoding.detections import Detections
from pipelines.decoding.masks import SourceMapping
from pipelines.decoding.nms import nms_indices
from pipelines.decoding.plausibility import blank_frame_problems, problems
from pipelines.decoding.preprocess import PreprocessConfig, Transform, compact, normalise, preprocess
from pipelines.decoding.rotated import rotated_nms_indices
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


def model_input_hw(runtime: Runtime) -> tuple[int, int]:
    """The (height, width) in pixels the model's image input takes (a dynamic one: its metadata's
    `imgsz`, else `DEFAULT_INPUT_SIZE`); `DecoderError` for a model without one image input."""
    return _input_size(_image_input(runtime), runtime)


def _input_quantization(spec: TensorSpec, mean: float, std: float) -> Quantization | None:
    """The model's own quantization, or for an integer input without one: raw pixels."""
    if not np.issubdtype(spec.dtype, np.integer):
        return None
    if spec.quantization is not None:
        return spec.quantization
    # q = x / scale + zp with x = (p - mean) / std  ->  q = p (uint8) or p - 128 (int8)
    zero_point = round(mean) - (128 if spec.dtype == np.int8 else 0)
    return Quantization(scale=1.0 / std, zero_point=zero_point)


def _shapes_text(outputs: Sequence[npt.NDArray[Any]]) -> str:
    return ", ".join(str(tuple(o.shape)) for o in outputs)


def nms_keep(name: DecoderName, candidates: Detections, iou: float, max_det: int) -> npt.NDArray[np.intp]:
    """Indices of the candidates kept, best first: by class-aware NMS (rotated NMS by
    probabilistic IoU for oriented boxes), or the best `max_det` for a final-output decoder."""
    if name in NMS_FREE:
        return np.argsort(-candidates.confidence, kind="stable")[:max_det]
    if name in ROTATED and candidates.xywhr is not None:
        return rotated_nms_indices(candidates.xywhr, candidates.confidence, iou, max_det, candidates.class_id)
    return nms_indices(candidates.xyxy, candidates.confidence, iou, max_det, candidates.class_id)


def to_source(detections: Detections, transform: Transform) -> Detections:
    """`detections` in input-tensor pixels -> the source frame's pixels (boxes and keypoints
    clipped to the frame; oriented boxes scaled, not clipped; masks drawn in the frame from now on)."""
    h, w = transform.source_hw
    kpts = detections.keypoints
    if kpts is not None:
        kpts = kpts.copy()
        kpts[..., 0] = np.clip((kpts[..., 0] - transform.pad_x) / transform.scale_x, 0, w)
        kpts[..., 1] = np.clip((kpts[..., 1] - transform.pad_y) / transform.scale_y, 0, h)
    xywhr = detections.xywhr
    if xywhr is not None:
        xywhr = xywhr.copy()
        xywhr[:, 0] = (xywhr[:, 0] - transform.pad_x) / transform.scale_x
        xywhr[:, 1] = (xywhr[:, 1] - transform.pad_y) / transform.scale_y
        xywhr[:, 2] /= transform.scale_x
        xywhr[:, 3] /= transform.scale_y
    masks = detections.masks
    if masks is not None:
        mapping = SourceMapping(transform.scale_x, transform.scale_y, transform.pad_x, transform.pad_y, (h, w))
        masks = masks.to_source(mapping)
    return replace(detections, xyxy=transform.to_source(detections.xyxy), keypoints=kpts, xywhr=xywhr, masks=masks)


class FrameDetector(Protocol):
    """What a pipeline needs of a detector: a `Detector`, a camera's view of one with its own
    `DetectionFilter` (`CameraDetector`), or a camera's hold on a model shared with other
    cameras (`pipelines.shared_model.CameraModel`). `postprocess` keeps what
    `detection_filter` says. `close` ends this user's hold: a `Detector` closes its runtime."""

    @property
    def runtime(self) -> Runtime: ...

    @property
    def detection_filter(self) -> DetectionFilter: ...

    def prepare(self, frame: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], Transform]:
        """The frame as the model's input, for `infer`; a float input may come back as its uint8
        pixels (`Detector.compact`), which `infer` normalises."""

    def infer(self, tensor: npt.NDArray[Any]) -> list[npt.NDArray[Any]]: ...

    def postprocess(self, outputs: list[npt.NDArray[Any]], transform: Transform) -> Detections: ...

    def close(self) -> None: ...


class Detector:
    """Runs one detection model on frames.

    `decoder` ``"auto"`` picks the decoder from the outputs and metadata (the reason is in
    `decoder_reason`); a decoder named here must fit, else `DecoderError`. `conf` is the score
    threshold (0..1: kept above it), `iou` the NMS overlap threshold, `max_det` the most
    detections kept per frame: the model's own `detection_filter` (a bundle's manifest
    thresholds), which the plausibility guard judges the decoders with. One left None is the
    model's exporter's own (Ultralytics: conf 0.25, iou 0.7), else `DEFAULTS`'s. A camera may keep
    detections by another filter (`postprocess`'s `detection_filter`, `CameraDetector`).
    """

    def __init__(
        self,
        runtime: Runtime,
        decoder: DecoderName | str = "auto",
        conf: float | None = None,
        iou: float | None = None,
        max_det: int | None = None,
    ) -> None:
        self.runtime = runtime
        defaults = defaults_for(runtime.metadata.raw.get("author"))
        self.detection_filter = ThresholdChoice(conf, iou, max_det).over(defaults)  # ValueError naming a bad value
        spec = _image_input(runtime)
        self.input_hw = _input_size(spec, runtime)
        layout = spec.layout or "NCHW"
        probe_config = PreprocessConfig(
            size=self.input_hw, layout=layout, dtype=spec.dtype, quantization=_input_quantization(spec, 0.0, 255.0)
        )
        # a black frame of the input's own size: no padding, so the tensor is uniform (zeros for /255)
        blank_tensor, blank_transform = preprocess(np.zeros((*self.input_hw, 3), np.uint8), probe_config)
        blank = self._run(blank_tensor, self.runtime)
        self.output_shapes = [tuple(o.shape) for o in blank]
        hints = ModelHints.from_metadata(runtime.metadata)
        if decoder == "auto":
            candidates = decoder_candidates(self.output_shapes, self.input_hw, hints, blank)
        elif decoder in DECODERS:
            candidates = [Candidate(decoder, "chosen by configuration")]
        else:
            raise DecoderError(f"unknown decoder {decoder!r}; known: auto, {', '.join(DECODERS)}")
        fitting: list[tuple[Candidate, Decode]] = []
        rejected: list[tuple[DecoderName, list[str]]] = []
        for candidate in candidates:
            decode, note = decoder_for(candidate.name, blank, hints)
            found = self._blank_problems(candidate.name, decode, blank, blank_transform.input_hw)
            if found:
                rejected.append((candidate.name, found))
            else:
                fitting.append((Candidate(candidate.name, "; ".join(filter(None, (candidate.reason, note)))), decode))
        if not fitting:
            raise DecoderError(self._mismatch(blank, rejected, explicit=decoder != "auto"))
        #: the decoder in use and its decode function, replaced together (one reference)
        self._current = fitting[0]
        convention = CONVENTIONS[self.decoder]
        #: later candidates that also read the blank frame plausibly and take the same input
        self._fallbacks = [(c, d) for c, d in fitting[1:] if CONVENTIONS[c.name] == convention]
        self._auto = decoder == "auto"
        self._switch_lock = threading.Lock()
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
        for name, found in rejected:
            log.info("decoder %s does not fit: %s", name, "; ".join(found))
        log.info("decoder %s: %s", self.decoder, self.decoder_reason)

    @property
    def conf(self) -> float:
        """The model's own score threshold."""
        return self.detection_filter.conf

    @property
    def iou(self) -> float:
        """The model's own NMS overlap threshold."""
        return self.detection_filter.iou

    @property
    def max_det(self) -> int:
        """The model's own most detections per frame."""
        return self.detection_filter.max_det

    @property
    def decoder(self) -> DecoderName:
        """The decoder in use."""
        return self._current[0].name

    @property
    def decoder_reason(self) -> str:
        """Why it was chosen."""
        return self._current[0].reason

    def _blank_problems(
        self, name: DecoderName, decode: Decode, outputs: list[npt.NDArray[Any]], input_hw: tuple[int, int]
    ) -> list[str]:
        """What the guard finds wrong when `decode` reads the model's outputs on a blank frame."""
        try:
            candidates = decode(outputs, input_hw, self.conf)
        except DecoderError as exc:
            return [str(exc)]
        survivors = len(candidates) if name in NMS_FREE else len(nms_keep(name, candidates, self.iou, self.max_det + 1))
        return problems(candidates, input_hw) + blank_frame_problems(survivors, self.max_det)

    @staticmethod
    def _mismatch(
        outputs: Sequence[npt.NDArray[Any]], rejected: Sequence[tuple[DecoderName, list[str]]], explicit: bool
    ) -> str:
        """The error for decoders that read the outputs implausibly: the shapes and what was wrong."""
        shapes = _shapes_text(outputs)
        if explicit and len(rejected) == 1:
            name, found = rejected[0]
            return f"decoder {name} does not fit this model's outputs {shapes}: {'; '.join(found)}"
        tried = "; ".join(f"{name}: {', '.join(found)}" for name, found in rejected)
        return f"no decoder reads this model's outputs {shapes} plausibly: {tried}"

    def prepare(self, frame: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], Transform]:
        """Preprocess a BGR ``(H, W, 3) uint8`` frame into the model's input tensor."""
        return preprocess(frame, self.preprocess_config)

    def compact(self, frame: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], Transform]:
        """`prepare`, but a float input stays uint8 pixels until `infer` (a 640x640 input: 1.2 MB
        instead of 4.9 MB while the frame waits for the model): what a camera's pipeline holds."""
        return compact(frame, self.preprocess_config)

    def infer(self, tensor: npt.NDArray[Any], runtime: Runtime | None = None) -> list[npt.NDArray[Any]]:
        """Run the model on a `prepare`d or `compact` tensor (or a batch of them); outputs come
        back dequantized to float32. `runtime` is another runtime on the same model (a serving
        thread's own, `Runtime.for_worker`); default: this one's."""
        return self._run(normalise(tensor, self.preprocess_config), runtime or self.runtime)

    def _run(self, tensor: npt.NDArray[Any], runtime: Runtime) -> list[npt.NDArray[Any]]:
        raw = runtime.infer([tensor])
        return [dequantize(array, spec) for array, spec in zip(raw, self.runtime.outputs, strict=True)]

    def _decode_checked(
        self, outputs: list[npt.NDArray[Any]], input_hw: tuple[int, int], conf: float
    ) -> tuple[DecoderName, Detections]:
        """Decode (candidates scoring above `conf`) and run the guard; with ``auto``, move to the
        next candidate that reads these outputs plausibly. Raises `DecoderError` when none does."""
        (name, _), decode = self._current
        candidates = decode(outputs, input_hw, conf)
        found = problems(candidates, input_hw)
        if not found:
            return name, candidates
        rejected = [(name, found)]
        with self._switch_lock:
            for candidate, other in self._fallbacks if self._auto else []:
                try:
                    alternative = other(outputs, input_hw, conf)
                except DecoderError as exc:
                    rejected.append((candidate.name, [str(exc)]))
                    continue
                also = problems(alternative, input_hw)
                if also:
                    rejected.append((candidate.name, also))
                    continue
                log.warning(
                    "decoder %s read a frame implausibly (%s): switching to %s", name, "; ".join(found), candidate.name
                )
                self._fallbacks = [f for f in self._fallbacks if f[0] != candidate]
                self._current = (candidate, other)
                return candidate.name, alternative
        raise DecoderError(self._mismatch(outputs, rejected, explicit=not self._auto or len(rejected) == 1))

    def check(self, tensor: npt.NDArray[Any], raw_outputs: Sequence[npt.NDArray[Any]]) -> None:
        """Run the plausibility guard on the raw outputs the model gave for `tensor` (a bundle's
        reference input): raises `DecoderError` naming the output shapes and what looked wrong."""
        hw = tensor.shape[2:4] if self.preprocess_config.layout == "NCHW" else tensor.shape[1:3]
        outputs = [dequantize(array, spec) for array, spec in zip(raw_outputs, self.runtime.outputs, strict=True)]
        input_hw = (int(hw[0]), int(hw[1]))
        found = problems(self._current[1](outputs, input_hw, self.conf), input_hw)
        if found:
            raise DecoderError(self._mismatch(outputs, [(self.decoder, found)], explicit=True))

    def postprocess(
        self,
        outputs: list[npt.NDArray[Any]],
        transform: Transform,
        detection_filter: DetectionFilter | None = None,
    ) -> Detections:
        """Decode (checked by the guard), keep the wanted classes, NMS unless the model's output is
        final, and map boxes to frame pixels (clipped; boxes left empty are dropped).
        `detection_filter` is the camera's (default: the model's own); safe from several threads."""
        keep = detection_filter or self.detection_filter
        name, candidates = self._decode_checked(outputs, transform.input_hw, keep.conf)
        candidates = keep.keep_classes(candidates)
        kept = to_source(candidates[nms_keep(name, candidates, keep.iou, keep.max_det)], transform)
        xyxy = kept.xyxy
        visible = (xyxy[:, 2] > xyxy[:, 0]) & (xyxy[:, 3] > xyxy[:, 1])
        return kept[visible]

    def close(self) -> None:
        """Close the runtime (the detector is done serving)."""
        self.runtime.close()

    def detect(self, frame: npt.NDArray[Any], detection_filter: DetectionFilter | None = None) -> Detections:
        """Detect objects in one BGR ``(H, W, 3) uint8`` frame; boxes in frame pixels."""
        tensor, transform = self.prepare(frame)
        return self.postprocess(self.infer(tensor), transform, detection_filter)


class CameraDetector:
    """One camera's own `Detector` (a model not shared with other cameras) kept by the camera's
    `DetectionFilter`: the `FrameDetector` its pipeline uses. `close` closes the detector."""

    def __init__(self, detector: Detector, detection_filter: DetectionFilter) -> None:
        self.detector, self.detection_filter = detector, detection_filter

    @property
    def runtime(self) -> Runtime:
        return self.detector.runtime

    def prepare(self, frame: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], Transform]:
        return self.detector.compact(frame)

    def infer(self, tensor: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
        return self.detector.infer(tensor)

    def postprocess(self, outputs: list[npt.NDArray[Any]], transform: Transform) -> Detections:
        return self.detector.postprocess(outputs, transform, self.detection_filter)

    def close(self) -> None:
        self.detector.close()
