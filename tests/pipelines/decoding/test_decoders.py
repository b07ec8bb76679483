"""`pipelines.decoding.decoders`: the grid decoders on hand-made outputs (YOLOv8, YOLOv5, YOLOX, SSD)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoding.decoders import (
    DecoderError,
    decode_ssd,
    decode_yolov5,
    decode_yolov8,
    decode_yolox,
    yolox_cells,
)
from pipelines.decoding.nms import class_aware_nms
from runtimes.base import Quantization, TensorSpec, dequantize

INPUT_HW = (640, 640)


# (x1, y1, x2, y2, class, score) in input pixels
OBJECTS = [(100.0, 120.0, 300.0, 400.0, 0, 0.9), (400.0, 50.0, 620.0, 200.0, 2, 0.6)]


NC = 3


N = 8400


def yolov8_output(normalised: bool = False, transposed: bool = False, noise: float = 0.05) -> np.ndarray:
    """(1, 4+nc, N) with OBJECTS at anchors 10 and 20, low-score noise elsewhere."""
    rng = np.random.default_rng(0)
    out = np.zeros((4 + NC, N), np.float32)
    out[:4] = rng.uniform(0, 640, (4, N))
    out[4:] = rng.uniform(0, noise, (NC, N))
    for anchor, (x1, y1, x2, y2, cls, score) in zip((10, 20), OBJECTS, strict=True):
        out[:4, anchor] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
        out[4 + cls, anchor] = score
    if normalised:
        out[:4] /= 640.0
    out = out[None]
    return out.transpose(0, 2, 1).copy() if transposed else out


def assert_objects(found, objects=OBJECTS, atol=1.0):
    found = found.sorted_by_confidence()
    assert len(found) == len(objects), f"expected {len(objects)} detections, got {len(found)}"
    for i, (x1, y1, x2, y2, cls, score) in enumerate(sorted(objects, key=lambda o: -o[5])):
        np.testing.assert_allclose(found.xyxy[i], [x1, y1, x2, y2], atol=atol)
        assert found.class_id[i] == cls
        assert found.confidence[i] == pytest.approx(score, abs=0.02)


@pytest.mark.parametrize(("normalised", "transposed"), [(False, False), (True, False), (False, True), (True, True)])
def test_yolov8_pixel_normalised_and_transposed(normalised: bool, transposed: bool) -> None:
    out = yolov8_output(normalised, transposed)
    assert_objects(decode_yolov8([out], INPUT_HW, 0.25))


def test_yolov8_normalised_boxes_scale_to_a_non_square_input() -> None:
    out = np.zeros((1, 5, 100), np.float32)
    out[0, :4, 7] = [0.5, 0.5, 0.25, 0.5]
    out[0, 4, 7] = 0.8
    found = decode_yolov8([out], (384, 640), 0.25)
    np.testing.assert_allclose(found.xyxy[0], [240, 96, 400, 288], atol=1e-3)


def test_yolov8_quantized_int8_output_decodes_after_dequantize() -> None:
    spec = TensorSpec("out", (1, 4 + NC, N), np.dtype(np.int8), quantization=Quantization(1 / 255, -128))
    real = yolov8_output(normalised=True)
    q = np.clip(np.rint(real / spec.quantization.scale + spec.quantization.zero_point), -128, 127).astype(np.int8)
    found = decode_yolov8([dequantize(q, spec)], INPUT_HW, 0.25)
    assert_objects(found, atol=3.0)  # quantization step is 1/255 of 640 px = 2.5 px


def test_yolov8_threshold_is_strict_and_empty_is_well_formed() -> None:
    found = decode_yolov8([yolov8_output()], INPUT_HW, 0.95)
    assert len(found) == 0
    assert found.xyxy.shape == (0, 4)


def yolov5_output(normalised: bool = False) -> np.ndarray:
    out = np.zeros((25200, 5 + NC), np.float32)
    out[:, :4] = np.random.default_rng(1).uniform(0, 640, (25200, 4))
    out[:, 4] = 0.01
    for row, (x1, y1, x2, y2, cls, score) in zip((5, 99), OBJECTS, strict=True):
        out[row, :4] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
        out[row, 4] = 1.0
        out[row, 5 + cls] = score
    if normalised:
        out[:, :4] /= 640.0
    return out[None]


@pytest.mark.parametrize("normalised", [False, True])
def test_yolov5_objectness_times_class(normalised: bool) -> None:
    assert_objects(decode_yolov5([yolov5_output(normalised)], INPUT_HW, 0.25))


def test_yolov5_objectness_scales_the_score() -> None:
    out = yolov5_output()
    out[0, 5, 4] = 0.5  # objectness of the first object
    found = decode_yolov5([out], INPUT_HW, 0.25).sorted_by_confidence()
    assert found.confidence.tolist() == pytest.approx([0.6, 0.45])


def yolox_output(hw: tuple[int, int], decoded: bool = False) -> np.ndarray:
    """Undecoded YOLOX head: one object at stride 16, cell (gx=5, gy=3)."""
    cells = yolox_cells(hw)
    out = np.zeros((cells, 5 + NC), np.float32)
    out[:, 2:4] = -5.0
    first_16 = (hw[0] // 8) * (hw[1] // 8)
    row = first_16 + 3 * (hw[1] // 16) + 5
    # cx = (0.5 + 5) * 16 = 88, cy = (0.25 + 3) * 16 = 52, w = e^2 * 16, h = e^1 * 16
    out[row, :5] = [0.5, 0.25, 2.0, 1.0, 0.9]
    out[row, 5 + 1] = 0.8
    if decoded:
        out[:, :4] = [[8.0, 8.0, 1.0, 1.0]]
        out[row, :4] = [88.0, 52.0, np.exp(2.0) * 16, np.exp(1.0) * 16]
    return out[None]


@pytest.mark.parametrize("decoded", [False, True])
def test_yolox_grid_decoding(decoded: bool) -> None:
    hw = (416, 416)
    found = decode_yolox([yolox_output(hw, decoded)], hw, 0.25)
    w, h = np.exp(2.0) * 16, np.exp(1.0) * 16
    np.testing.assert_allclose(found.xyxy[0], [88 - w / 2, 52 - h / 2, 88 + w / 2, 52 + h / 2], rtol=1e-5)
    assert found.class_id.tolist() == [1]
    assert found.confidence[0] == pytest.approx(0.72)


def test_yolox_non_square_grid() -> None:
    hw = (384, 640)
    found = decode_yolox([yolox_output(hw)], hw, 0.25)
    assert len(found) == 1
    assert found.xyxy[0, 0] == pytest.approx(88 - np.exp(2.0) * 8, rel=1e-5)


def test_yolox_wrong_row_count_names_the_cells() -> None:
    with pytest.raises(DecoderError, match="3549 cells"):
        decode_yolox([np.full((1, 100, 85), 0.9, np.float32)], (416, 416), 0.25)


def ssd_outputs() -> list[np.ndarray]:
    boxes = np.zeros((1, 10, 4), np.float32)
    boxes[0, 0] = [0.1, 0.2, 0.5, 0.6]  # ymin, xmin, ymax, xmax
    boxes[0, 1] = [0.0, 0.0, 1.0, 1.0]
    classes = np.array([[16, 61] + [0] * 8], np.float32)
    scores = np.array([[0.8, 0.3] + [0.0] * 8], np.float32)
    count = np.array([2], np.float32)
    return [boxes, classes, scores, count]


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (2, 0, 3, 1), (3, 2, 1, 0)])
def test_ssd_any_output_order(order: tuple[int, ...]) -> None:
    outs = ssd_outputs()
    found = decode_ssd([outs[i] for i in order], (300, 400), 0.25).sorted_by_confidence()
    np.testing.assert_allclose(found.xyxy, [[80, 30, 240, 150], [0, 0, 400, 300]], atol=1e-4)
    assert found.class_id.tolist() == [16, 61]
    assert found.confidence.tolist() == pytest.approx([0.8, 0.3])


def test_ssd_count_limits_rows() -> None:
    outs = ssd_outputs()
    outs[3] = np.array([1], np.float32)
    assert len(decode_ssd(outs, (300, 300), 0.1)) == 1


def test_nms_after_decode_removes_duplicates_per_class() -> None:
    out = yolov8_output()
    out[0, :4, 11] = out[0, :4, 10] + 2  # near-duplicate of object 0, lower score, same class
    out[0, 4, 11] = 0.7
    out[0, :4, 12] = out[0, :4, 10]  # same box, other class: kept
    out[0, 5, 12] = 0.5
    found = class_aware_nms(decode_yolov8([out], INPUT_HW, 0.25), 0.45, 300)
    assert sorted(found.class_id.tolist()) == [0, 1, 2]


def z(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize(
    ("decode", "outputs", "message"),
    [
        (decode_yolov8, [z(1, 84, 10)] * 2, "yolov8 expects one output, the model has 2: [(1, 84, 10), (1, 84, 10)]"),
        (decode_yolov8, [z(1, 4, 10)], "yolov8 expects 4 box rows and at least one class row, got (4, 10)"),
        (decode_yolov5, [z(1, 10, 85)] * 2, "yolov5 expects one output, the model has 2"),
        (decode_yolov5, [z(1, 10, 5)], "yolov5 expects rows of 5 + classes values, got (10, 5)"),
        (decode_yolox, [z(1, 10, 85)] * 2, "yolox expects one output, the model has 2"),
        (decode_yolox, [z(1, 10, 5)], "yolox expects rows of 5 + classes values, got (10, 5)"),
        (decode_ssd, [z(1, 10, 4), z(1, 10), z(1, 10)], "ssd expects 4 outputs (boxes, classes, scores, count), got"),
        (
            decode_ssd,
            [z(1, 10, 4), z(1, 10), z(1, 10), z(2)],
            "ssd expects outputs shaped (1, K, 4), (1, K), (1, K), (1,)",
        ),
        (
            decode_ssd,
            [z(1, 10, 5), z(1, 10), z(1, 10), z(1)],
            "ssd expects outputs shaped (1, K, 4), (1, K), (1, K), (1,)",
        ),
        (
            decode_ssd,
            [z(1, 10, 4), z(1, 10), z(1, 10, 2), z(1)],
            "ssd expects outputs shaped (1, K, 4), (1, K), (1, K), (1,)",
        ),
    ],
)
def test_grid_decoder_refusals_name_the_decoder_and_the_shapes(decode, outputs, message: str) -> None:
    with pytest.raises(DecoderError) as refused:
        decode(outputs, INPUT_HW, 0.25)
    assert str(refused.value).startswith(message), refused.value
    if decode is decode_ssd:
        assert str([tuple(o.shape) for o in outputs]) in str(refused.value)


def test_yolox_wrong_row_count_names_width_and_height() -> None:
    with pytest.raises(DecoderError) as refused:
        decode_yolox([np.full((1, 100, 85), 0.9, np.float32)], (384, 640), 0.25)
    assert str(refused.value).startswith("yolox output has 100 rows but a 640x384 input has 5040 cells")


@pytest.mark.parametrize(
    ("decode", "output"),
    [
        # one candidate scoring exactly the threshold, one just above it
        (
            decode_yolov8,
            np.array(
                [
                    [
                        [100, 300] + [0] * 4,
                        [100, 300] + [0] * 4,
                        [20, 20] + [0] * 4,
                        [20, 20] + [0] * 4,
                        [0.5, 0.51] + [0] * 4,
                    ]
                ],
                np.float32,
            ),
        ),
        (decode_yolov5, np.array([[[100, 100, 20, 20, 0.5, 1.0], [300, 300, 20, 20, 1.0, 0.51]]], np.float32)),
        (decode_yolox, np.array([[[100, 100, 20, 20, 0.5, 1.0], [300, 300, 20, 20, 1.0, 0.51]]], np.float32)),
    ],
)
def test_a_candidate_exactly_at_the_threshold_is_left_out(decode, output: np.ndarray) -> None:
    found = decode([output], INPUT_HW, 0.5)
    np.testing.assert_allclose(found.xyxy, [[290, 290, 310, 310]])
    assert found.confidence.tolist() == pytest.approx([0.51])


def test_ssd_threshold_and_a_count_of_zero() -> None:
    outs = ssd_outputs()
    outs[2] = np.array([[0.8, 0.3] + [0.0] * 8], np.float32)
    assert decode_ssd(outs, (300, 400), 0.3).class_id.tolist() == [16]  # 0.3 is not above 0.3
    outs[3] = np.array([0], np.float32)
    assert len(decode_ssd(outs, (300, 400), 0.1)) == 0
    outs[3] = np.array([50], np.float32)  # more than the rows there are
    assert len(decode_ssd(outs, (300, 400), 0.1)) == 2


@pytest.mark.parametrize("k", [1, 4])
def test_ssd_with_one_or_four_detections(k: int) -> None:
    """K = 1 makes the classes and scores (1, 1); K = 4 makes them (1, 4) like the boxes' last axis."""
    boxes = np.tile(np.array([0.1, 0.2, 0.5, 0.6], np.float32), (1, k, 1))
    classes, scores = np.full((1, k), 16, np.float32), np.full((1, k), 0.8, np.float32)
    found = decode_ssd([boxes, classes, scores, np.array([k], np.float32)], (300, 400), 0.25)
    assert found.class_id.tolist() == [16] * k
    np.testing.assert_allclose(found.xyxy, [[80, 30, 240, 150]] * k, atol=1e-4)


def test_yolov8_square_output_is_rows_by_anchors() -> None:
    """(1, 6, 6): 4 box rows and 2 classes over 6 anchors, not 6 anchors of 6 values."""
    out = np.zeros((6, 6), np.float32)
    out[:4, 2] = [100, 100, 20, 40]
    out[5, 2] = 0.9
    found = decode_yolov8([out[None]], INPUT_HW, 0.25)
    np.testing.assert_allclose(found.xyxy, [[90, 80, 110, 120]])
    assert found.class_id.tolist() == [1]


@pytest.mark.parametrize("decode", [decode_yolov5, decode_yolox])
def test_one_class_models(decode) -> None:
    """Rows of 5 + 1 values (a single-class model), already in pixels."""
    out = np.array([[[100, 100, 20, 40, 0.9, 1.0], [8, 8, 1, 1, 0.0, 0.0]]], np.float32)
    found = decode([out], INPUT_HW, 0.25)
    np.testing.assert_allclose(found.xyxy, [[90, 80, 110, 120]])
    assert found.class_id.tolist() == [0] and found.confidence.tolist() == pytest.approx([0.9])


def test_yolox_centres_up_to_four_are_grid_offsets() -> None:
    """The rule that tells raw YOLOX offsets from decoded pixels: centres above 4 are pixels."""
    hw = (64, 64)
    raw = np.zeros((yolox_cells(hw), 6), np.float32)
    raw[0, :5] = [4.0, 0.0, 0.0, 0.0, 0.9]  # a raw offset of 4 cells: cx = (4 + 0) * 8 = 32
    raw[0, 5] = 1.0
    found = decode_yolox([raw[None]], hw, 0.25)
    np.testing.assert_allclose(found.xyxy, [[28, -4, 36, 4]])
    decoded = raw.copy()
    decoded[0, :4] = [4.5, 4.5, 2.0, 2.0]  # pixels: the centre is 4.5
    np.testing.assert_allclose(decode_yolox([decoded[None]], hw, 0.25).xyxy, [[3.5, 3.5, 5.5, 5.5]])
