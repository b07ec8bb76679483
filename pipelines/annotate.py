"""Drawing detections onto frames (for snapshots, ``--save-dir`` and the status page's live frame):
boxes and captions, and what task models give beyond boxes: masks (translucent, in the class's
colour), keypoints (COCO's skeleton when there are 17, else the points alone; a keypoint scoring
below 0.5 is not drawn) and oriented boxes (their four sides in place of the axis-aligned box)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from pipelines.decoding.detections import Detections
from pipelines.decoding.rotated import corners

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

#: COCO's 17-keypoint skeleton, as Ultralytics draws it (0-based keypoint pairs)
COCO_SKELETON = (
    (15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8),
    (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6),
)  # fmt: skip
#: a mask's weight where it is drawn (0..1)
MASK_ALPHA = 0.45
#: keypoints scoring below this (0..1) are not drawn
KEYPOINT_MIN_SCORE = 0.5


def _draw_masks(out: npt.NDArray[Any], detections: Detections) -> None:
    masks = detections.masks
    if masks is None or masks.shape != out.shape[:2]:
        return  # masks in other pixels than the frame's (a resized frame): boxes only
    for i, class_id in enumerate(detections.class_id.tolist()):
        where = masks.bitmap(i)
        color = np.array(PALETTE[class_id % len(PALETTE)], np.float32)
        out[where] = (out[where] * (1 - MASK_ALPHA) + color * MASK_ALPHA).astype(out.dtype)


def _draw_keypoints(out: npt.NDArray[Any], detections: Detections, radius: int, thickness: int) -> None:
    kpts = detections.keypoints
    if kpts is None:
        return
    for person, class_id in zip(kpts, detections.class_id.tolist(), strict=True):
        color = PALETTE[class_id % len(PALETTE)]
        seen = person[:, 2] >= KEYPOINT_MIN_SCORE if person.shape[1] == 3 else np.ones(len(person), bool)
        xy = np.round(person[:, :2]).astype(int)
        if len(person) == 17:
            for a, b in COCO_SKELETON:
                if seen[a] and seen[b]:
                    cv2.line(out, tuple(xy[a]), tuple(xy[b]), color, thickness, cv2.LINE_AA)
        for k in np.flatnonzero(seen):
            cv2.circle(out, tuple(xy[k]), radius, (255, 255, 255), -1, cv2.LINE_AA)
            cv2.circle(out, tuple(xy[k]), radius, color, 1, cv2.LINE_AA)


class BoxAnnotator:
    """Draws boxes and ``label score`` captions. `label` maps a class id to its text."""

    def __init__(self, label: Callable[[int], str] = str, thickness: int = 2, font_scale: float = 0.5) -> None:
        self.label, self.thickness, self.font_scale = label, thickness, font_scale

    def annotate(self, frame: npt.NDArray[Any], detections: Detections) -> npt.NDArray[Any]:
        """Return a copy of the BGR `frame` with `detections` (frame pixels) drawn on it."""
        out: npt.NDArray[Any] = frame.copy()
        _draw_masks(out, detections)
        sides = None if detections.xywhr is None else np.round(corners(detections.xywhr)).astype(np.int32)
        for i, ((x1, y1, x2, y2), score, class_id) in enumerate(
            zip(detections.xyxy.astype(int), detections.confidence, detections.class_id, strict=True)
        ):
            color = PALETTE[int(class_id) % len(PALETTE)]
            if sides is None:
                cv2.rectangle(out, (int(x1), int(y1)), (int(x2), int(y2)), color, self.thickness)
            else:
                cv2.polylines(out, [sides[i]], True, color, self.thickness, cv2.LINE_AA)
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
        _draw_keypoints(out, detections, radius=self.thickness + 2, thickness=self.thickness)
        return out


def encode_jpeg(image: npt.NDArray[Any], quality: int = 85) -> bytes:
    """JPEG bytes of a BGR image."""
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f"cannot encode a {image.shape} image as JPEG")
    return bytes(data.tobytes())
