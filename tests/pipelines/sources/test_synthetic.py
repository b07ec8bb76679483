"""`pipelines.sources.synthetic`: seeded pixels and truth, shapes inside the frame, visible fractions."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene


def test_same_seed_same_pixels_and_truth() -> None:
    a, b = SyntheticScene(seed=7), SyntheticScene(seed=7)
    for index in (0, 13, 500):
        (ia, ta), (ib, tb) = a.render(index), b.render(index)
        assert np.array_equal(ia, ib)
        assert np.array_equal(ta.detections.xyxy, tb.detections.xyxy)
    assert not np.array_equal(a.render(0)[0], SyntheticScene(seed=8).render(0)[0])


def test_shapes_move_and_stay_inside_the_frame() -> None:
    scene = SyntheticScene(width=320, height=240, num_shapes=6, seed=1)
    first = scene.render(0)[1].detections.xyxy
    later = scene.render(40)[1].detections.xyxy
    assert not np.allclose(first, later)
    for i in range(0, 2000, 97):
        boxes = scene.render(i)[1].detections.xyxy
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= 320).all()
        assert (boxes[:, 1] >= 0).all() and (boxes[:, 3] <= 240).all()


@pytest.mark.parametrize("seed", range(6))
def test_truth_box_is_the_drawn_shape(seed: int) -> None:
    """With one shape and no grain, the pixels that differ from the background are the box."""
    scene = SyntheticScene(width=200, height=160, num_shapes=1, seed=seed, noise=0.0)
    image, truth = scene.render(25)
    diff = np.abs(image.astype(int) - scene._background.astype(int)).sum(axis=2) > 60
    ys, xs = np.nonzero(diff)
    drawn = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
    # anti-aliased edges may tint one pixel beyond the geometric box on each side
    np.testing.assert_allclose(truth.detections.xyxy[0], drawn, atol=2.0)
    assert truth.detections.class_id[0] in range(len(CLASS_NAMES))
    assert truth.visible[0] == 1.0


def test_all_three_classes_appear() -> None:
    kinds = set()
    for seed in range(10):
        kinds |= set(SyntheticScene(num_shapes=5, seed=seed).render(0)[1].detections.class_id.tolist())
    assert kinds == {0, 1, 2}


def test_occluded_shapes_report_their_visible_fraction() -> None:
    fractions = np.concatenate(
        [SyntheticScene(num_shapes=8, seed=s).render(i)[1].visible for s in range(5) for i in (0, 50)]
    )
    assert ((fractions < 1.0) & (fractions >= 0.0)).any(), "some shapes overlap"
    assert (fractions <= 1.0).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"width": 10}, "at least 32x32"), ({"num_shapes": -1}, "num_shapes"), ({"size_range": (50, 600)}, "size_range")],
)
def test_bad_parameters(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        SyntheticScene(**kwargs)


def test_frames_encode_as_images() -> None:
    image, _ = SyntheticScene(seed=3).render(3)
    ok, _data = cv2.imencode(".png", image)
    assert ok and image.shape == (480, 640, 3) and image.dtype == np.uint8


def test_rotated_boxes_keypoints_and_masks_are_the_drawn_shapes() -> None:
    """Every shape's rotated box holds its pixels tightly; a triangle's keypoints are its vertices;
    its mask is its visible pixels."""
    import cv2

    from pipelines.decoding.rotated import corners

    scene = SyntheticScene(seed=10, num_shapes=6)
    _, truth = scene.render(5, masks=True)
    assert truth.obb is not None and truth.keypoints is not None and truth.masks is not None
    assert set(truth.detections.class_id.tolist()) == {0, 1, 2}
    for i, kind in enumerate(truth.detections.class_id):
        drawn = np.zeros((scene.height, scene.width), np.uint8)
        scene._draw(drawn, scene._shapes[i], 5, (1,))
        box = np.zeros_like(drawn)
        cv2.fillPoly(box, [np.round(corners(truth.obb[i : i + 1])[0]).astype(np.int32)], 1)
        assert (drawn & ~box.astype(bool)).sum() <= 0.02 * drawn.sum()  # the shape inside its box
        assert drawn.sum() >= (0.75 if kind == 0 else 0.45) * box.sum()  # and the box tight around it
        shown = truth.masks[i]
        assert shown.sum() == pytest.approx(truth.visible[i] * drawn.sum(), rel=0.01)
        if kind == 2:
            vertices = truth.keypoints[i, :, :2]
            rows, cols = np.nonzero(drawn)
            for x, y in vertices:
                assert np.hypot(cols - x, rows - y).min() < 2  # on the drawn triangle's corner
        else:
            assert not truth.keypoints[i].any()
    assert scene.render(5)[1].masks is None  # only when asked
