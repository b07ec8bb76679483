"""`pipelines.annotate`: boxes drawn in their class's colour at their corners on a copy, captions
from the label function, JPEG bytes that decode to the image."""

from __future__ import annotations

import cv2
import numpy as np

from pipelines.annotate import PALETTE, BoxAnnotator, encode_jpeg
from pipelines.decoding.detections import Detections


def _detections(boxes: list[list[float]], classes: list[int]) -> Detections:
    return Detections(np.array(boxes, np.float32), np.full(len(boxes), 0.5, np.float32), np.array(classes, np.int32))


def test_boxes_are_drawn_in_their_class_colour_on_a_copy() -> None:
    frame = np.zeros((120, 160, 3), np.uint8)
    labels: list[int] = []

    def label(class_id: int) -> str:
        labels.append(class_id)
        return "car"

    out = BoxAnnotator(label).annotate(frame, _detections([[20, 60, 80, 110], [100, 60, 150, 110]], [1, 13]))
    assert not frame.any(), "the frame itself is untouched"
    assert tuple(out[85, 20]) == PALETTE[1], "the left edge of the first box"
    assert tuple(out[110, 50]) == PALETTE[1], "its bottom edge"
    assert tuple(out[85, 150]) == PALETTE[13 % len(PALETTE)], "class ids cycle through the palette"
    assert not out[85, 50].any(), "inside a box stays as it was"
    assert labels == [1, 13]
    caption = out[40:60, 20:80]
    assert (caption == PALETTE[1]).all(axis=2).any() and (caption == 255).all(axis=2).any(), (
        "a filled caption, white text"
    )


def test_a_box_at_the_top_keeps_its_caption_inside_the_frame() -> None:
    out = BoxAnnotator().annotate(np.zeros((60, 60, 3), np.uint8), _detections([[5, 2, 50, 50]], [0]))
    below_the_top = out[8:12, 8:40]
    assert (below_the_top == PALETTE[0]).all(axis=2).any(), "the caption starts at row 0 and fills its height"


def test_encode_jpeg_decodes_to_the_image() -> None:
    image = np.zeros((48, 64, 3), np.uint8)
    image[:, 32:] = (0, 0, 255)
    data = encode_jpeg(image, quality=95)
    decoded = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == image.shape
    assert np.abs(decoded.astype(int) - image).mean() < 3
    noise = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    assert len(encode_jpeg(noise, quality=10)) < len(encode_jpeg(noise, quality=95))


def test_masks_are_drawn_translucent_where_the_mask_is() -> None:
    """The demo segmentation model on a synthetic frame: pixels inside a mask change (and keep
    some of the frame), pixels outside every box are left alone."""
    from pathlib import Path

    from testkit import DEMO_MODELS

    from pipelines.decoding.detector import Detector
    from pipelines.sources.synthetic import SyntheticScene
    from runtimes.registry import load_runtime

    frame, _ = SyntheticScene(640, 480, num_shapes=4, seed=310_002).render(0)
    with load_runtime("onnxruntime", Path(DEMO_MODELS / "demo_segment.onnx")) as runtime:
        found = Detector(runtime).detect(frame)
    assert len(found) and found.masks is not None
    out = BoxAnnotator(thickness=1).annotate(frame, found)
    drawn = np.abs(out.astype(int) - frame.astype(int)).sum(axis=2) > 0
    mask = found.masks.bitmaps().any(axis=0)
    inner = cv2.erode(mask.astype(np.uint8), np.ones((9, 9), np.uint8)).astype(bool)
    assert inner.any() and drawn[inner].mean() > 0.95, "inside the masks is tinted"
    boxes = np.zeros(mask.shape, bool)
    for x1, y1, x2, y2 in found.xyxy.astype(int):
        boxes[max(y1 - 20, 0) : y2 + 3, max(x1 - 3, 0) : x2 + 3] = True  # captions above
    assert not drawn[~boxes].any(), "outside the boxes nothing is drawn"
    first = inner & found.masks.bitmap(0)
    assert not (out[first] == PALETTE[int(found.class_id[0]) % len(PALETTE)]).all(), "translucent, not painted over"


def _pose(kpts: list[list[float]]) -> Detections:
    base = _detections([[10, 10, 150, 110]], [2])
    return Detections(base.xyxy, base.confidence, base.class_id, keypoints=np.array([kpts], np.float32))


def test_a_coco_skeleton_joins_its_keypoints() -> None:
    kpts = [[20.0 + 7 * k, 60.0, 0.9] for k in range(17)]
    kpts[15], kpts[13] = [30.0, 100.0, 0.9], [130.0, 100.0, 0.9]  # a left ankle-knee bone along y = 100
    kpts[16] = [80.0, 30.0, 0.2]  # too unsure: neither drawn nor joined
    out = BoxAnnotator().annotate(np.zeros((120, 160, 3), np.uint8), _pose(kpts))
    assert tuple(out[100, 80]) == PALETTE[2], "the bone between keypoints 15 and 13"
    assert tuple(out[100, 30]) == (255, 255, 255), "a keypoint's white dot"
    assert not out[30, 80].any() and not out[45, 110].any(), "the unsure keypoint, and its bone to 14"


def test_keypoints_without_a_skeleton_are_points_only() -> None:
    out = BoxAnnotator().annotate(
        np.zeros((120, 160, 3), np.uint8), _pose([[30, 100, 0.9], [130, 100, 0.9], [80, 40, 0.9]])
    )
    assert tuple(out[100, 30]) == (255, 255, 255) and tuple(out[40, 80]) == (255, 255, 255)
    assert not out[100, 80].any(), "three keypoints: no bones"


def test_an_oriented_box_is_drawn_by_its_sides() -> None:
    xywhr = np.array([[80, 60, 60, 60, np.pi / 4]], np.float32)  # a diamond, corners 42 px out
    base = _detections([[38, 18, 122, 102]], [3])
    out = BoxAnnotator(thickness=1).annotate(
        np.zeros((120, 160, 3), np.uint8), Detections(base.xyxy, base.confidence, base.class_id, xywhr=xywhr)
    )
    assert out[60, 38:40].any() and out[60, 120:123].any(), "its left and right corners"
    assert out[39, 59:62].any(), "the middle of its upper-left side"
    assert not out[100, 40].any() and not out[100, 120].any(), "the axis-aligned box's corners are not drawn"
