"""`Masks`: instance masks kept as mask coefficients and the model's shared prototypes, drawn as
bitmaps or outlines only when asked.

A segmentation model (Ultralytics ``-seg``) gives each detection 32 coefficients and the frame
``(32, H/4, W/4)`` prototypes. A mask is drawn as Ultralytics draws it (8.4's ``process_mask``
with ``upsample=True``, then ``scale_masks``): ``coefficients @ prototypes`` (logits at a quarter
of the input), bilinear upsampling to the input tensor, logit > 0, cropped to the detection's
box in input pixels, the letterbox padding removed and the rest resized to the source frame.
Storing coefficients instead of bitmaps keeps a detection a few hundred bytes until something
draws it. Immutable; safe to read from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class SourceMapping:
    """Where the input tensor's content lies in it (``x_src = (x - pad_x) / scale_x``) and the
    source frame's (height, width): the letterbox to remove from a mask."""

    scale_x: float
    scale_y: float
    pad_x: float
    pad_y: float
    source_hw: tuple[int, int]

    def content(self, input_hw: tuple[int, int]) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) of the frame's pixels inside the input tensor."""
        h, w = self.source_hw
        top, left = round(self.pad_y - 0.1), round(self.pad_x - 0.1)
        bottom = min(input_hw[0], top + max(round(h * self.scale_y), 1))
        right = min(input_hw[1], left + max(round(w * self.scale_x), 1))
        return top, bottom, left, right


@dataclass(frozen=True)
class Masks:
    """``n`` instance masks of one frame.

    - `coefficients`: ``(n, c) float32``, each detection's mask coefficients;
    - `prototypes`: ``(c, mh, mw) float32``, the frame's prototypes (shared by all masks);
    - `boxes`: ``(n, 4) float32`` xyxy in input-tensor pixels: each mask is cropped to its box;
    - `input_hw`: the input tensor's (height, width);
    - `mapping`: how to reach source-frame pixels; ``None``: masks are drawn in input pixels.
    """

    coefficients: npt.NDArray[np.float32]
    prototypes: npt.NDArray[np.float32]
    boxes: npt.NDArray[np.float32]
    input_hw: tuple[int, int]
    mapping: SourceMapping | None = None

    def __post_init__(self) -> None:
        n = self.coefficients.shape[0]
        if self.coefficients.ndim != 2 or self.prototypes.ndim != 3:
            raise ValueError(
                f"masks: expected coefficients (n, c) and prototypes (c, h, w), got "
                f"{self.coefficients.shape} and {self.prototypes.shape}"
            )
        if self.coefficients.shape[1] != self.prototypes.shape[0]:
            raise ValueError(
                f"masks: {self.coefficients.shape[1]} coefficients per mask but {self.prototypes.shape[0]} prototypes"
            )
        if self.boxes.shape != (n, 4):
            raise ValueError(f"masks: expected boxes ({n}, 4), got {self.boxes.shape}")

    def __len__(self) -> int:
        return int(self.coefficients.shape[0])

    def __getitem__(self, index: npt.NDArray[np.bool_] | npt.NDArray[np.integer] | slice) -> Masks:
        c = self.coefficients.shape[1]
        return replace(
            self, coefficients=self.coefficients[index].reshape(-1, c), boxes=self.boxes[index].reshape(-1, 4)
        )

    def to_source(self, mapping: SourceMapping) -> Masks:
        """The same masks, drawn in the source frame's pixels from now on."""
        return replace(self, mapping=mapping)

    @property
    def shape(self) -> tuple[int, int]:
        """(height, width) of the bitmaps: the source frame's once mapped, else the input's."""
        return self.mapping.source_hw if self.mapping is not None else self.input_hw

    def _input_mask(self, i: int) -> npt.NDArray[np.uint8]:
        """Mask `i` at input-tensor resolution, cropped to its box: ``(H, W) uint8`` of 0 / 1."""
        c, mh, mw = self.prototypes.shape
        logits = (self.coefficients[i] @ self.prototypes.reshape(c, -1)).reshape(mh, mw)
        h, w = self.input_hw
        # cv2's bilinear resize samples pixel centres as torch's interpolate(align_corners=False)
        up = cv2.resize(logits, (w, h), interpolation=cv2.INTER_LINEAR)
        mask: npt.NDArray[np.uint8] = (up > 0).astype(np.uint8)
        x1, y1, x2, y2 = self.boxes[i]
        cols, rows = np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32)
        mask *= ((cols >= x1) & (cols < x2))[None, :]
        mask *= ((rows >= y1) & (rows < y2))[:, None]
        return mask

    def bitmap(self, i: int) -> npt.NDArray[np.bool_]:
        """Mask `i` as an ``(H, W) bool`` bitmap of `shape`."""
        mask = self._input_mask(i)
        if self.mapping is None:
            return mask.astype(bool)
        top, bottom, left, right = self.mapping.content(self.input_hw)
        h, w = self.mapping.source_hw
        content = np.ascontiguousarray(mask[top:bottom, left:right], np.float32)
        # Ultralytics' scale_masks: bilinear on the 0 / 1 mask, kept where above one half
        scaled = cv2.resize(content, (w, h), interpolation=cv2.INTER_LINEAR)
        result: npt.NDArray[np.bool_] = scaled > 0.5
        return result

    def bitmaps(self) -> npt.NDArray[np.bool_]:
        """All masks, ``(n, H, W) bool``: n frames of memory; prefer `bitmap` one at a time."""
        out = np.zeros((len(self), *self.shape), bool)
        for i in range(len(self)):
            out[i] = self.bitmap(i)
        return out

    def outline(self, i: int, max_points: int = 64) -> list[npt.NDArray[np.float32]]:
        """Mask `i`'s outer contours as polygons ``(k, 2) float32`` of ``x, y`` pixels of `shape`,
        largest first, at most `max_points` points in all (simplified until they fit; a polygon
        that can no longer keep 3 points is left out)."""
        mask = self._input_mask(i)
        contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        contours = sorted(contours, key=cv2.contourArea, reverse=True)
        epsilon = 0.5
        while True:
            polygons = [cv2.approxPolyDP(c, epsilon, True).reshape(-1, 2) for c in contours]
            polygons = [p for p in polygons if len(p) >= 3]
            total = 0
            kept = []
            for polygon in polygons:
                if total + len(polygon) > max_points:
                    break
                kept.append(polygon)
                total += len(polygon)
            if len(kept) == len(polygons) or epsilon > max(self.input_hw):
                break
            epsilon *= 1.6
        return [self._to_shape(p.astype(np.float32)) for p in kept]

    def _to_shape(self, points: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
        if self.mapping is None:
            return np.asarray(points, np.float32)
        m = self.mapping
        h, w = m.source_hw
        x = np.clip((points[:, 0] - m.pad_x) / m.scale_x, 0, w)
        y = np.clip((points[:, 1] - m.pad_y) / m.scale_y, 0, h)
        return np.stack([x, y], axis=1).astype(np.float32)
