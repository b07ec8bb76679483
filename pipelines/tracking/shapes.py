"""`ObjectShape`: the bounded summary of a task model's detection that an object's events carry.

A segmentation detection becomes its mask's outline, simplified to at most `MAX_POLYGON_POINTS`
points in all (`pipelines.decoding.masks.Masks.outline`, largest part first); a pose detection
its K keypoints (at most `MAX_KEYPOINTS`); an oriented box its five numbers. A box detector's
detection has no shape (``None``). All in source-frame pixels, ``x`` right, ``y`` down; angles
in radians. Immutable values: any thread. JSON only at the edge (`agent.event_values`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.decoding.detections import Detections

#: the most polygon points a shape keeps, over all its parts
MAX_POLYGON_POINTS = 32
#: the most keypoints a shape keeps (COCO has 17)
MAX_KEYPOINTS = 64

Polygon = tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class ObjectShape:
    """`polygons`: the mask's outer outlines (each ``(x, y)`` points, at least 3; at most
    `MAX_POLYGON_POINTS` points in all); `keypoints`: ``(x, y, score)`` each (score 1.0 for a
    model without keypoint scores); `obb`: ``(cx, cy, w, h, angle)`` (pixels, radians)."""

    polygons: tuple[Polygon, ...] = ()
    keypoints: tuple[tuple[float, float, float], ...] = ()
    obb: tuple[float, float, float, float, float] | None = None

    def __post_init__(self) -> None:
        points = sum(len(p) for p in self.polygons)
        if points > MAX_POLYGON_POINTS:
            raise ValueError(f"shape: {points} polygon points, at most {MAX_POLYGON_POINTS}")
        if len(self.keypoints) > MAX_KEYPOINTS:
            raise ValueError(f"shape: {len(self.keypoints)} keypoints, at most {MAX_KEYPOINTS}")


def shape_of(detections: Detections, i: int, max_points: int = MAX_POLYGON_POINTS) -> ObjectShape | None:
    """Detection `i`'s shape, or ``None`` when `detections` carry no masks, keypoints or
    oriented boxes. Drawing the outline costs one mask (see `Masks.outline`): call it when a
    track's best detection changes, not for every detection."""
    if detections.masks is None and detections.keypoints is None and detections.xywhr is None:
        return None
    polygons: tuple[Polygon, ...] = ()
    if detections.masks is not None:
        outline = detections.masks.outline(i, max_points=min(max_points, MAX_POLYGON_POINTS))
        polygons = tuple(tuple((float(x), float(y)) for x, y in part) for part in outline)
    keypoints: tuple[tuple[float, float, float], ...] = ()
    if detections.keypoints is not None:
        kpts = detections.keypoints[i][:MAX_KEYPOINTS]
        keypoints = tuple((float(k[0]), float(k[1]), float(k[2]) if kpts.shape[1] == 3 else 1.0) for k in kpts)
    obb = None
    if detections.xywhr is not None:
        cx, cy, w, h, angle = (float(v) for v in detections.xywhr[i])
        obb = (cx, cy, w, h, angle)
    return ObjectShape(polygons, keypoints, obb)
