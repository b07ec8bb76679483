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
