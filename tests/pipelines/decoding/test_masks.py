"""`pipelines.decoding.masks`: masks drawn as Ultralytics draws them (coefficients @ prototypes,
bilinear upsampling, logit > 0, cropped to the box, the letterbox removed), and bounded outlines."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from pipelines.decoding.masks import Masks, SourceMapping
from pipelines.decoding.preprocess import PreprocessConfig, preprocess


def _disc_prototypes(input_hw: tuple[int, int], centre: tuple[float, float], radius: float) -> np.ndarray:
    """Two prototypes at a quarter of the input: a disc's signed distance (positive inside) and ones."""
    h, w = input_hw[0] // 4, input_hw[1] // 4
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    inside = radius / 4 - np.hypot(xs + 0.5 - centre[0] / 4, ys + 0.5 - centre[1] / 4)
    return np.stack([inside, np.ones_like(inside)]).astype(np.float32)


def test_a_mask_is_the_positive_logits_cropped_to_its_box() -> None:
    protos = _disc_prototypes((64, 64), (32, 32), 12)
    masks = Masks(
        np.array([[1.0, 0.0], [1.0, 0.0]], np.float32),
        protos,
        np.array([[0, 0, 64, 64], [0, 0, 32, 64]], np.float32),
        (64, 64),
    )
    full, half = masks.bitmaps()
    ys, xs = np.mgrid[0:64, 0:64]
    disc = np.hypot(xs + 0.5 - 32, ys + 0.5 - 32) < 12
    assert (full ^ disc).sum() <= 0.05 * disc.sum()
    assert not half[:, 32:].any() and half[:, :32].sum() == pytest.approx(full[:, :32].sum(), abs=2)
    # a negative offset (the constant prototype) shrinks it
    smaller = Masks(np.array([[1.0, -2.0]], np.float32), protos, np.array([[0, 0, 64, 64]], np.float32), (64, 64))
    assert smaller.bitmap(0).sum() < 0.8 * full.sum()


def test_the_letterbox_is_removed_in_source_pixels() -> None:
    """A 640x480 frame in a 320x320 input sits 40 rows down; the mask comes back where the disc is."""
    frame = np.zeros((480, 640, 3), np.uint8)
    cv2.circle(frame, (400, 150), 60, (255, 255, 255), -1)
    _, transform = preprocess(frame, PreprocessConfig(size=(320, 320)))
    assert transform.pad_y == 40
    centre = (400 * transform.scale_x + transform.pad_x, 150 * transform.scale_y + transform.pad_y)
    protos = _disc_prototypes((320, 320), centre, 60 * transform.scale_x)
    masks = Masks(np.array([[1.0, 0.0]], np.float32), protos, np.array([[0, 0, 320, 320]], np.float32), (320, 320))
    mapping = SourceMapping(transform.scale_x, transform.scale_y, transform.pad_x, transform.pad_y, (480, 640))
    mapped = masks.to_source(mapping)
    assert mapped.shape == (480, 640)
    truth = frame[..., 0] > 0
    got = mapped.bitmap(0)
    assert (got & truth).sum() / (got | truth).sum() > 0.9
    polygon = mapped.outline(0, 32)[0]
    assert np.abs(polygon.mean(axis=0) - [400, 150]).max() < 3


def test_outlines_stay_within_their_point_budget() -> None:
    protos = _disc_prototypes((128, 128), (64, 64), 50)
    masks = Masks(np.array([[1.0, 0.0]], np.float32), protos, np.array([[0, 0, 128, 128]], np.float32), (128, 128))
    for budget in (8, 20, 200):
        polygons = masks.outline(0, budget)
        assert polygons and sum(len(p) for p in polygons) <= budget
        assert all(len(p) >= 3 for p in polygons)
    assert sum(len(p) for p in masks.outline(0, 200)) > sum(len(p) for p in masks.outline(0, 8))


def test_selection_keeps_coefficients_and_boxes_together() -> None:
    protos = np.zeros((2, 4, 4), np.float32)
    masks = Masks(
        np.array([[1, 0], [2, 0], [3, 0]], np.float32), protos, np.arange(12, dtype=np.float32).reshape(3, 4), (16, 16)
    )
    picked = masks[np.array([2, 0])]
    assert picked.coefficients[:, 0].tolist() == [3, 1] and picked.boxes[:, 0].tolist() == [8, 0]
    assert len(masks[np.array([False, True, False])]) == 1


@pytest.mark.parametrize(
    ("coefficients", "prototypes", "boxes", "error"),
    [
        (
            np.zeros((2, 3), np.float32),
            np.zeros((2, 4, 4), np.float32),
            np.zeros((2, 4), np.float32),
            "3 coefficients per mask but 2 prototypes",
        ),
        (
            np.zeros((2, 2), np.float32),
            np.zeros((2, 4, 4), np.float32),
            np.zeros((3, 4), np.float32),
            r"expected boxes \(2, 4\)",
        ),
        (
            np.zeros(2, np.float32),
            np.zeros((2, 4, 4), np.float32),
            np.zeros((2, 4), np.float32),
            "expected coefficients",
        ),
    ],
)
def test_shapes_are_checked(coefficients: np.ndarray, prototypes: np.ndarray, boxes: np.ndarray, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Masks(coefficients, prototypes, boxes, (16, 16))
