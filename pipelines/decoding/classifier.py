"""`Classifier`: a classification model (Ultralytics ``-cls``: one output ``(1, nc)``) on whole
images or crops, and its answer, `Classification`.

Preprocessing is Ultralytics' (8.4 ``classify_transforms``, torchvision on a PIL image): the
shortest side resized to the input size (PIL's antialiased bilinear filter, reproduced here
with NumPy), a centre crop to the input, RGB, /255. The output is taken as probabilities (Ultralytics exports apply
softmax); an output that is not a distribution (negative, or not summing to 1) is read as
logits and softmax is applied. `classify` is safe from one thread at a time per runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipelines.decoding.decoders import DecoderError
from runtimes.base import Runtime, dequantize

#: probabilities summing to within this of 1 are taken as a distribution already
_SUM_TOLERANCE = 0.02


@dataclass(frozen=True)
class Classification:
    """Class scores of one image: `scores` ``(nc,) float32`` probabilities in 0..1."""

    scores: npt.NDArray[np.float32]

    def top(self, k: int = 5) -> list[tuple[int, float]]:
        """The `k` best ``(class_id, score)``, highest first (equal scores: lower id first)."""
        order = np.argsort(-self.scores, kind="stable")[: max(k, 0)]
        return [(int(i), float(self.scores[i])) for i in order]


def _resample_weights(source: int, target: int) -> npt.NDArray[np.float64]:
    """``(target, source)`` weights of PIL's antialiased bilinear resampling along one axis: a
    triangle filter widened by the shrink factor, centred on each target pixel's centre."""
    scale = source / target
    width = max(scale, 1.0)
    weights = np.zeros((target, source))
    for out in range(target):
        centre = (out + 0.5) * scale
        first = max(int(centre - width + 0.5), 0)
        last = min(int(centre + width + 0.5), source)
        taps = np.arange(first, last)
        row = np.clip(1.0 - np.abs((taps - centre + 0.5) / width), 0.0, None)
        weights[out, first:last] = row / row.sum()
    return weights


def _resize(image: npt.NDArray[np.uint8], width: int, height: int) -> npt.NDArray[np.uint8]:
    """Resize as PIL's ``Image.resize(BILINEAR)`` (what Ultralytics' torchvision transforms run):
    antialiased, horizontal pass then vertical, each rounded to 8 bits."""
    src_h, src_w = image.shape[:2]
    across = np.einsum("ow,hwc->hoc", _resample_weights(src_w, width), image.astype(np.float64))
    across = np.clip(np.rint(across), 0, 255)
    down = np.einsum("oh,hwc->owc", _resample_weights(src_h, height), across)
    resized: npt.NDArray[np.uint8] = np.clip(np.rint(down), 0, 255).astype(np.uint8)
    return resized


def crop_tensor(image: npt.NDArray[Any], size: tuple[int, int], layout: str) -> npt.NDArray[np.float32]:
    """A BGR ``(H, W, 3) uint8`` image -> the classifier's float input ``(1, 3, h, w)`` or
    ``(1, h, w, 3)``: shortest side to the input (torchvision's ``Resize(int)``: the longer side
    ``int(size * long / short)``), centre crop (torchvision's rounding), RGB, /255."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8 or min(image.shape[:2]) < 1:
        raise ValueError(f"expected a (H, W, 3) uint8 image, got {image.shape} {image.dtype}")
    dst_h, dst_w = size
    src_h, src_w = image.shape[:2]
    side = min(dst_h, dst_w)
    if src_w <= src_h:
        new_w, new_h = side, int(side * src_h / src_w)
    else:
        new_w, new_h = int(side * src_w / src_h), side
    resized = _resize(image, max(new_w, dst_w), max(new_h, dst_h))
    top = round((resized.shape[0] - dst_h) / 2.0)
    left = round((resized.shape[1] - dst_w) / 2.0)
    rgb = resized[top : top + dst_h, left : left + dst_w, ::-1].astype(np.float32) / 255.0
    tensor = rgb.transpose(2, 0, 1) if layout == "NCHW" else rgb
    return np.ascontiguousarray(tensor[None], np.float32)


class Classifier:
    """Runs one classification model: ``classify(image)`` -> `Classification`.

    Raises `DecoderError` at construction when the model is not one: not one image input, or
    not one ``(1, nc)`` output (naming the shapes found).
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        images = [s for s in runtime.inputs if s.layout is not None]
        if len(runtime.inputs) != 1 or not images:
            shapes = ", ".join(f"{s.name}{s.shape}" for s in runtime.inputs)
            raise DecoderError(f"a classifier takes one image input (N, 3, H, W) or (N, H, W, 3), found {shapes}")
        self._input = images[0]
        h, w = self._input.image_hw
        imgsz = runtime.metadata.imgsz or (224, 224)
        self.input_hw = (h or imgsz[0], w or imgsz[1])
        # one run on a blank image: the output shapes as they really are (dynamic axes resolved)
        blank = self.runtime.infer([self.prepare(np.zeros((*self.input_hw, 3), np.uint8))])
        if len(blank) != 1 or len([d for d in blank[0].shape if d != 1]) > 1:
            shapes = ", ".join(str(tuple(o.shape)) for o in blank)
            raise DecoderError(f"a classifier gives one output of class scores (1, nc), the model has {shapes}")
        self.num_classes = int(blank[0].size)

    def prepare(self, image: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """The model's input tensor for a BGR image (quantized for an integer input)."""
        tensor = crop_tensor(image, self.input_hw, self._input.layout or "NCHW")
        spec = self._input
        if not np.issubdtype(spec.dtype, np.integer):
            return tensor.astype(spec.dtype, copy=False)
        q = spec.quantization
        info = np.iinfo(spec.dtype)
        scale, zero_point = (q.scale, q.zero_point) if q is not None else (1 / 255, 0)
        quantized: npt.NDArray[Any] = np.clip(np.rint(tensor / scale + zero_point), info.min, info.max)
        return quantized.astype(spec.dtype)

    def classify(self, image: npt.NDArray[Any]) -> Classification:
        """Class probabilities of a BGR ``(H, W, 3) uint8`` image or crop."""
        raw = self.runtime.infer([self.prepare(image)])[0]
        scores = dequantize(raw, self.runtime.outputs[0]).reshape(-1).astype(np.float32)
        total = float(scores.sum())
        if scores.min(initial=0.0) < -_SUM_TOLERANCE or abs(total - 1.0) > _SUM_TOLERANCE:
            shifted = np.exp(scores - scores.max())
            scores = (shifted / shifted.sum()).astype(np.float32)
        return Classification(scores)
