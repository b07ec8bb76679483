"""Turning a camera frame into a model input tensor, and boxes back into frame pixels.

Frames are OpenCV images: ``(H, W, 3) uint8`` in BGR order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import cv2
import numpy as np
import numpy.typing as npt

from runtimes.base import Layout, Quantization

Resize = Literal["letterbox", "letterbox-topleft", "stretch"]
ColorOrder = Literal["RGB", "BGR"]


@dataclass(frozen=True)
class PreprocessConfig:
    """How a model wants its input.

    - `size`: (height, width) of the input tensor in pixels.
    - `resize`: ``letterbox`` keeps the aspect ratio and pads equally on both sides,
      ``letterbox-topleft`` pads only right and bottom (YOLOX), ``stretch`` resizes to `size`.
    - `mean`, `std`: the float input is ``(pixel - mean) / std`` (pixel in 0..255).
    - `rect_stride`: for models with dynamic height/width: pad only up to the next multiple of
      this stride instead of to the full `size` (a 1280x720 frame into 640 gives 640x384).
    - `quantization`: set for an int8/uint8 input; the float value is then quantized as
      ``q = round(x / scale + zero_point)``, clipped to the dtype's range.
    """

    size: tuple[int, int]
    resize: Resize = "letterbox"
    pad_value: int = 114
    color: ColorOrder = "RGB"
    layout: Layout = "NCHW"
    mean: float = 0.0
    std: float = 255.0
    dtype: np.dtype[Any] = np.dtype(np.float32)  # noqa: RUF009 (a dtype is immutable)
    quantization: Quantization | None = None
    rect_stride: int | None = None


@dataclass(frozen=True)
class Transform:
    """How tensor pixels map back to source pixels: ``x_src = (x - pad_x) / scale_x``.
    `input_hw` is the tensor's (height, width), `source_hw` the frame's."""

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float
    source_hw: tuple[int, int]
    input_hw: tuple[int, int]

    def to_source(self, xyxy: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Map ``(n, 4)`` xyxy boxes from tensor pixels to source pixels, clipped to the image."""
        h, w = self.source_hw
        out = np.empty_like(xyxy, dtype=np.float32)
        out[:, [0, 2]] = (xyxy[:, [0, 2]] - self.pad_x) / self.scale_x
        out[:, [1, 3]] = (xyxy[:, [1, 3]] - self.pad_y) / self.scale_y
        out[:, [0, 2]] = np.clip(out[:, [0, 2]], 0, w)
        out[:, [1, 3]] = np.clip(out[:, [1, 3]], 0, h)
        return out


def _resize(image: npt.NDArray[Any], config: PreprocessConfig) -> tuple[npt.NDArray[Any], Transform]:
    """Resize `image` to its place in the tensor; the returned `Transform` says where it goes
    (`pad_x`, `pad_y`) inside the tensor's `input_hw`. Padding is left to the caller."""
    src_h, src_w = image.shape[:2]
    dst_h, dst_w = config.size
    if config.resize == "stretch":
        resized = cv2.resize(image, (dst_w, dst_h), interpolation=cv2.INTER_LINEAR)
        return resized, Transform(dst_w / src_w, dst_h / src_h, 0.0, 0.0, (src_h, src_w), (dst_h, dst_w))
    r = min(dst_h / src_h, dst_w / src_w)
    new_w, new_h = max(1, round(src_w * r)), max(1, round(src_h * r))
    if config.rect_stride:
        stride = config.rect_stride
        dst_w, dst_h = -(-new_w // stride) * stride, -(-new_h // stride) * stride
    if (new_w, new_h) != (src_w, src_h):
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    if config.resize == "letterbox":
        left, top = (dst_w - new_w) // 2, (dst_h - new_h) // 2
    else:
        left, top = 0, 0
    return image, Transform(new_w / src_w, new_h / src_h, float(left), float(top), (src_h, src_w), (dst_h, dst_w))


def _borders(transform: Transform, h: int, w: int) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) padding around an `h` x `w` image inside the tensor."""
    dst_h, dst_w = transform.input_hw
    top, left = int(transform.pad_y), int(transform.pad_x)
    return top, dst_h - h - top, left, dst_w - w - left


def _normalise_into(out: npt.NDArray[Any], pixels: npt.NDArray[Any], config: PreprocessConfig) -> None:
    """``out = (pixels - mean) / std`` in float32 steps; without a mean, a true division, as
    Ultralytics' predictor (``div_(255)``): multiplying by 1/255 differs by one unit in the last
    place on half the pixels, which an INT8 model's rounding to its grid turns into boxes a pixel
    apart and NMS decisions the other way. `preprocess` and `normalise` both come here."""
    if config.mean:
        np.multiply(pixels, np.float32(1.0 / config.std), out=out, casting="unsafe")
        out += np.float32(-config.mean / config.std)
    else:
        np.divide(pixels, np.float32(config.std), out=out, casting="unsafe")


def _float_tensor(resized: npt.NDArray[Any], transform: Transform, config: PreprocessConfig) -> npt.NDArray[Any]:
    """Write the resized uint8 pixels, normalised, straight into the tensor's interior and fill
    only the borders: no padded uint8 canvas, and each channel converted from a contiguous plane."""
    h, w = resized.shape[:2]
    dst_h, dst_w = transform.input_hw
    top, left = int(transform.pad_y), int(transform.pad_x)
    planes = cv2.split(resized)  # B, G, R
    if config.color == "RGB":
        planes = planes[::-1]
    nchw = config.layout == "NCHW"
    tensor = np.empty((1, 3, dst_h, dst_w) if nchw else (1, dst_h, dst_w, 3), config.dtype)
    spatial = tensor[0] if nchw else tensor[0].transpose(2, 0, 1)  # (3, H, W) view either way
    pad = np.empty((), config.dtype)
    _normalise_into(pad, np.uint8(config.pad_value), config)
    spatial[:, :top] = pad
    spatial[:, top + h :] = pad
    spatial[:, top : top + h, :left] = pad
    spatial[:, top : top + h, left + w :] = pad
    for channel, plane in enumerate(planes):
        _normalise_into(spatial[channel, top : top + h, left : left + w], plane, config)
    return tensor


def _checked(image: npt.NDArray[Any]) -> None:
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"expected a (H, W, 3) uint8 image, got {image.shape} {image.dtype}")


def _canvas(image: npt.NDArray[Any], config: PreprocessConfig) -> tuple[npt.NDArray[Any], Transform]:
    """The resized, padded uint8 pixels in the tensor's layout and colour order, ``(1, 3, h, w)``
    or ``(1, h, w, 3)``, as a view of the padded canvas (not contiguous); not normalised."""
    resized, transform = _resize(image, config)
    top, bottom, left, right = _borders(transform, resized.shape[0], resized.shape[1])
    pad = (config.pad_value,) * 3
    canvas = cv2.copyMakeBorder(resized, top, bottom, left, right, cv2.BORDER_CONSTANT, value=pad)
    pixels = canvas[..., ::-1] if config.color == "RGB" else canvas  # views, no copy
    if config.layout == "NCHW":
        pixels = pixels.transpose(2, 0, 1)
    return pixels[None], transform


def preprocess(image: npt.NDArray[Any], config: PreprocessConfig) -> tuple[npt.NDArray[Any], Transform]:
    """Resize, reorder, normalise and (de)quantize one BGR ``(H, W, 3) uint8`` frame.

    Returns the ``(1, 3, h, w)`` or ``(1, h, w, 3)`` tensor of `config.dtype` and the
    `Transform` that maps its boxes back to the frame.
    """
    _checked(image)
    if np.issubdtype(config.dtype, np.floating):
        resized, transform = _resize(image, config)
        return _float_tensor(resized, transform, config), transform
    pixels, transform = _canvas(image, config)
    if config.quantization is not None:
        q = config.quantization
        info = np.iinfo(config.dtype)
        # q = (pixel - mean) / std / scale + zp, folded into one multiply-add.
        gain = 1.0 / (config.std * q.scale)
        offset = q.zero_point - config.mean * gain
        values = np.rint(pixels.astype(np.float32) * np.float32(gain) + np.float32(offset))
        return np.ascontiguousarray(np.clip(values, info.min, info.max), dtype=config.dtype), transform
    # an integer input without quantization parameters takes raw pixels
    return np.ascontiguousarray(pixels, dtype=config.dtype), transform


def compact(image: npt.NDArray[Any], config: PreprocessConfig) -> tuple[npt.NDArray[Any], Transform]:
    """`preprocess`, but a float input is left as its uint8 pixels (a quarter of the bytes) for
    `normalise` to finish when the model runs: what a frame holds while it waits for a model
    another camera is using. Other inputs come back exactly as `preprocess` makes them."""
    if not np.issubdtype(config.dtype, np.floating):
        return preprocess(image, config)
    _checked(image)
    pixels, transform = _canvas(image, config)
    return np.ascontiguousarray(pixels), transform


def normalise(tensor: npt.NDArray[Any], config: PreprocessConfig) -> npt.NDArray[Any]:
    """A `compact` tensor (or a batch of them) as the model's float input, ``(pixel - mean) / std``
    in `config.dtype`, equal to what `preprocess` gives; any other tensor is returned as it is."""
    if tensor.dtype != np.uint8 or not np.issubdtype(config.dtype, np.floating):
        return tensor
    out = np.empty(tensor.shape, config.dtype)
    _normalise_into(out, tensor, config)
    return out
