"""`Detections`: the detections of one frame, as arrays grouped by field."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:  # masks need OpenCV only when they are drawn
    from pipelines.decoding.masks import Masks


@dataclass(frozen=True)
class Detections:
    """Boxes found in one image.

    - `xyxy`: ``(n, 4) float32``, corners ``x1, y1, x2, y2`` in pixels of the image they refer
      to (the source frame once a `Detector` returns them), ``x`` to the right, ``y`` down.
    - `confidence`: ``(n,) float32`` in 0..1.
    - `class_id`: ``(n,) int32``, the model's class index.
    - `tracker_id`: ``(n,) int32`` or ``None``: the track each box belongs to, once a tracker
      (`pipelines.tracking.tracker.ByteTracker`) has run; ``-1`` for a box no confirmed track owns.

    What a task model gives beyond boxes (``None`` for a box detector); `xyxy` stays the
    axis-aligned box of every detection, so tracking, lines and zones run unchanged:

    - `masks`: `pipelines.decoding.masks.Masks` of ``n`` instance masks (segmentation);
    - `keypoints`: ``(n, K, 3) float32``: ``x, y`` in the same pixels as `xyxy`, then a score in
      0..1 (``(n, K, 2)`` for models without keypoint scores);
    - `xywhr`: ``(n, 5) float32`` oriented boxes: centre ``x, y``, width, height (pixels) and the
      rotation in radians (clockwise as seen on the image, ``y`` down); `xyxy` is then the
      axis-aligned box around its corners.

    Shapes and dtypes are checked at construction; ``detections[mask]`` or
    ``detections[indices]`` returns a new `Detections`, every field selected together.
    """

    xyxy: npt.NDArray[np.float32]
    confidence: npt.NDArray[np.float32]
    class_id: npt.NDArray[np.int32]
    tracker_id: npt.NDArray[np.int32] | None = None
    masks: Masks | None = None
    keypoints: npt.NDArray[np.float32] | None = None
    xywhr: npt.NDArray[np.float32] | None = None

    def __post_init__(self) -> None:
        xyxy, confidence, class_id = self.xyxy, self.confidence, self.class_id
        if xyxy.ndim != 2 or xyxy.shape[1] != 4:
            raise ValueError(f"xyxy: expected shape (_, 4), got {xyxy.shape}")
        n = xyxy.shape[0]
        if confidence.shape != (n,):
            raise ValueError(f"confidence: expected shape ({n},), got {confidence.shape}")
        if class_id.shape != (n,):
            raise ValueError(f"class_id: expected shape ({n},), got {class_id.shape}")
        if self.tracker_id is not None and self.tracker_id.shape != (n,):
            raise ValueError(f"tracker_id: expected shape ({n},), got {self.tracker_id.shape}")
        for name, array, dtype in (
            ("xyxy", xyxy, np.float32),
            ("confidence", confidence, np.float32),
            ("class_id", class_id, np.int32),
            ("tracker_id", class_id if self.tracker_id is None else self.tracker_id, np.int32),
        ):
            if array.dtype != dtype:
                raise ValueError(f"{name}: expected dtype {np.dtype(dtype)}, got {array.dtype}")
        self._check_task_fields(n)

    def _check_task_fields(self, n: int) -> None:
        if self.masks is not None and len(self.masks) != n:
            raise ValueError(f"masks: expected {n} masks, got {len(self.masks)}")
        kpts = self.keypoints
        if kpts is not None:
            if kpts.ndim != 3 or kpts.shape[0] != n or kpts.shape[2] not in (2, 3):
                raise ValueError(f"keypoints: expected shape ({n}, K, 2 or 3), got {kpts.shape}")
            if kpts.dtype != np.float32:
                raise ValueError(f"keypoints: expected dtype float32, got {kpts.dtype}")
        if self.xywhr is not None:
            if self.xywhr.shape != (n, 5):
                raise ValueError(f"xywhr: expected shape ({n}, 5), got {self.xywhr.shape}")
            if self.xywhr.dtype != np.float32:
                raise ValueError(f"xywhr: expected dtype float32, got {self.xywhr.dtype}")

    @classmethod
    def empty(cls) -> Detections:
        return cls(
            xyxy=np.zeros((0, 4), np.float32),
            confidence=np.zeros((0,), np.float32),
            class_id=np.zeros((0,), np.int32),
        )

    @classmethod
    def from_arrays(cls, xyxy: npt.ArrayLike, confidence: npt.ArrayLike, class_id: npt.ArrayLike) -> Detections:
        """Build from array-likes, converting dtypes (shapes are still checked)."""
        return cls(
            xyxy=np.asarray(xyxy, np.float32).reshape(-1, 4),
            confidence=np.asarray(confidence, np.float32),
            class_id=np.asarray(class_id, np.int32),
        )

    def __len__(self) -> int:
        return int(self.xyxy.shape[0])

    def __getitem__(self, index: npt.NDArray[np.bool_] | npt.NDArray[np.integer] | slice) -> Detections:
        kpts = self.keypoints
        return Detections(
            xyxy=self.xyxy[index].reshape(-1, 4),
            confidence=self.confidence[index],
            class_id=self.class_id[index],
            tracker_id=None if self.tracker_id is None else self.tracker_id[index],
            masks=None if self.masks is None else self.masks[index],
            keypoints=None if kpts is None else kpts[index].reshape(-1, *kpts.shape[1:]),
            xywhr=None if self.xywhr is None else self.xywhr[index].reshape(-1, 5),
        )

    def with_tracker_id(self, tracker_id: npt.ArrayLike) -> Detections:
        """The same detections with `tracker_id` ``(n,)`` set (converted to int32, shape checked)."""
        return replace(self, tracker_id=np.asarray(tracker_id, np.int32))

    def sorted_by_confidence(self) -> Detections:
        """Highest confidence first (a stable sort, so equal scores keep their order)."""
        return self[np.argsort(-self.confidence, kind="stable")]
