"""`Detections`: the detections of one frame, as arrays grouped by field."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Detections:
    """Boxes found in one image.

    - `xyxy`: ``(n, 4) float32``, corners ``x1, y1, x2, y2`` in pixels of the image they refer
      to (the source frame once a `Detector` returns them), ``x`` to the right, ``y`` down.
    - `confidence`: ``(n,) float32`` in 0..1.
    - `class_id`: ``(n,) int32``, the model's class index.
    - `tracker_id`: ``(n,) int32`` or ``None``: the track each box belongs to, once a tracker
      (`pipelines.tracking.tracker.ByteTracker`) has run; ``-1`` for a box no confirmed track owns.

    Shapes and dtypes are checked at construction; ``detections[mask]`` or
    ``detections[indices]`` returns a new `Detections`.
    """

    xyxy: npt.NDArray[np.float32]
    confidence: npt.NDArray[np.float32]
    class_id: npt.NDArray[np.int32]
    tracker_id: npt.NDArray[np.int32] | None = None

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
        return Detections(
            xyxy=self.xyxy[index].reshape(-1, 4),
            confidence=self.confidence[index],
            class_id=self.class_id[index],
            tracker_id=None if self.tracker_id is None else self.tracker_id[index],
        )

    def with_tracker_id(self, tracker_id: npt.ArrayLike) -> Detections:
        """The same boxes with `tracker_id` ``(n,)`` set (converted to int32, shape checked)."""
        return Detections(self.xyxy, self.confidence, self.class_id, np.asarray(tracker_id, np.int32))

    def sorted_by_confidence(self) -> Detections:
        """Highest confidence first (a stable sort, so equal scores keep their order)."""
        return self[np.argsort(-self.confidence, kind="stable")]
