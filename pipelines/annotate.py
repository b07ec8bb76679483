"""Drawing detections onto frames (for snapshots and the status page)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cv2
import numpy.typing as npt

from pipelines.decoding.detections import Detections

#: distinct BGR colours, cycled by class id
PALETTE = (
    (56, 56, 255),
    (151, 157, 255),
    (31, 112, 255),
    (29, 178, 255),
    (49, 210, 207),
    (10, 249, 72),
    (23, 204, 146),
    (134, 219, 61),
    (211, 188, 0),
    (209, 85, 0),
    (255, 115, 100),
    (255, 56, 132),
)


class BoxAnnotator:
    """Draws boxes and ``label score`` captions. `label` maps a class id to its text."""

    def __init__(self, label: Callable[[int], str] = str, thickness: int = 2, font_scale: float = 0.5) -> None:
        self.label, self.thickness, self.font_scale = label, thickness, font_scale

    def annotate(self, frame: npt.NDArray[Any], detections: Detections) -> npt.NDArray[Any]:
        """Return a copy of the BGR `frame` with `detections` (frame pixels) drawn on it."""
        out: npt.NDArray[Any] = frame.copy()
        for (x1, y1, x2, y2), score, class_id in zip(
            detections.xyxy.astype(int), detections.confidence, detections.class_id, strict=True
        ):
            color = PALETTE[int(class_id) % len(PALETTE)]
            cv2.rectangle(out, (int(x1), int(y1)), (int(x2), int(y2)), color, self.thickness)
            caption = f"{self.label(int(class_id))} {score:.2f}"
            (w, h), _ = cv2.getTextSize(caption, cv2.FONT_HERSHEY_SIMPLEX, self.font_scale, 1)
            top = max(int(y1) - h - 4, 0)
            cv2.rectangle(out, (int(x1), top), (int(x1) + w + 4, top + h + 4), color, -1)
            cv2.putText(
                out,
                caption,
                (int(x1) + 2, top + h + 1),
                cv2.FONT_HERSHEY_SIMPLEX,
                self.font_scale,
                (255, 255, 255),
                1,
                cv2.LINE_AA,
            )
        return out


def encode_jpeg(image: npt.NDArray[Any], quality: int = 85) -> bytes:
    """JPEG bytes of a BGR image."""
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f"cannot encode a {image.shape} image as JPEG")
    return bytes(data.tobytes())
