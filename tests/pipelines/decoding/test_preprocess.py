"""`pipelines.decoding.preprocess`: letterbox, stretch, layouts, colour order, quantized inputs, boxes back."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.decoding.preprocess import PreprocessConfig, compact, normalise, preprocess
from runtimes.base import Quantization


def frame(h: int = 300, w: int = 600) -> np.ndarray:
    """BGR frame: blue left half, red right half."""
    image = np.zeros((h, w, 3), np.uint8)
    image[:, : w // 2] = (255, 0, 0)
    image[:, w // 2 :] = (0, 0, 255)
    return image


def test_centred_letterbox_nchw_rgb_float() -> None:
    tensor, t = preprocess(frame(), PreprocessConfig(size=(640, 640)))
    assert tensor.shape == (1, 3, 640, 640) and tensor.dtype == np.float32
    assert (t.scale_x, t.scale_y, t.pad_x, t.pad_y) == (640 / 600, 320 / 300, 0.0, 160.0)
    assert tensor[0, :, 0, 0] == pytest.approx([114 / 255] * 3)  # padding
    assert tensor[0, :, 320, 10] == pytest.approx([0, 0, 1])  # blue pixel in RGB order
    assert tensor[0, :, 320, 630] == pytest.approx([1, 0, 0])  # red
    assert tensor.flags["C_CONTIGUOUS"]


def test_topleft_letterbox_bgr_raw_nhwc() -> None:
    config = PreprocessConfig(size=(416, 416), resize="letterbox-topleft", color="BGR", layout="NHWC", std=1.0)
    tensor, t = preprocess(frame(), config)
    assert tensor.shape == (1, 416, 416, 3)
    assert (t.pad_x, t.pad_y) == (0.0, 0.0)
    assert tensor[0, 10, 10].tolist() == [255, 0, 0]  # BGR kept
    assert tensor[0, 300, 10].tolist() == [114, 114, 114]  # bottom padding


def test_boxes_map_back_and_clip() -> None:
    _, t = preprocess(frame(), PreprocessConfig(size=(640, 640)))
    boxes = np.array([[0, 160, 640, 480], [-50, 100, 700, 700]], np.float32)
    np.testing.assert_allclose(t.to_source(boxes), [[0, 0, 600, 300], [0, 0, 600, 300]], atol=1e-4)


def test_stretch_maps_axes_independently() -> None:
    _, t = preprocess(frame(), PreprocessConfig(size=(300, 300), resize="stretch"))
    np.testing.assert_allclose(t.to_source(np.array([[150, 150, 300, 300]], np.float32)), [[300, 150, 600, 300]])


@pytest.mark.parametrize(
    ("dtype", "quant", "mean", "std", "expected_pad"),
    [
        (np.int8, Quantization(1 / 255, -128), 0.0, 255.0, 114 - 128),  # YOLOv8 int8: q = p - 128
        (np.uint8, Quantization(0.0078125, 128), 127.5, 127.5, 114),  # SSD uint8: q ~= p
    ],
)
def test_quantized_inputs(dtype, quant, mean, std, expected_pad) -> None:
    config = PreprocessConfig(
        size=(64, 64), layout="NHWC", mean=mean, std=std, dtype=np.dtype(dtype), quantization=quant
    )
    tensor, _ = preprocess(frame(32, 64), config)
    assert tensor.dtype == dtype
    assert int(tensor[0, 0, 0, 0]) == pytest.approx(expected_pad, abs=1)
    red = tensor[0, 32, 40]  # RGB order: red channel first
    assert int(red[0]) == pytest.approx(255 + (expected_pad - 114), abs=1)


def test_rejects_non_bgr_images() -> None:
    with pytest.raises(ValueError, match=r"expected a \(H, W, 3\) uint8 image"):
        preprocess(np.zeros((10, 10), np.uint8), PreprocessConfig(size=(32, 32)))


#: where a 300 x 517 ("wide") or 517 x 333 ("tall") image lands in a 320 x 480 input, worked out by
#: hand: letterbox scale r = min(320 / h, 480 / w); wide r = 0.9284 -> 279 x 480 (278.5 rounds up),
#: tall r = 0.6190 -> 320 x 206; centred padding is (input - image) // 2; rect_stride 32 shrinks the
#: input to the next multiple of 32 around the image (wide: 279 -> 288 high, tall: 206 -> 224 wide).
#: Values: (input_hw, image_hw, top, left).
GEOMETRY: dict[tuple[str, str, int | None], tuple[tuple[int, int], tuple[int, int], int, int]] = {
    ("letterbox", "wide", None): ((320, 480), (279, 480), 20, 0),
    ("letterbox", "wide", 32): ((288, 480), (279, 480), 4, 0),
    ("letterbox", "tall", None): ((320, 480), (320, 206), 0, 137),
    ("letterbox", "tall", 32): ((320, 224), (320, 206), 0, 9),
    ("letterbox-topleft", "wide", None): ((320, 480), (279, 480), 0, 0),
    ("letterbox-topleft", "wide", 32): ((288, 480), (279, 480), 0, 0),
    ("letterbox-topleft", "tall", None): ((320, 480), (320, 206), 0, 0),
    ("letterbox-topleft", "tall", 32): ((320, 224), (320, 206), 0, 0),
    ("stretch", "wide", None): ((320, 480), (320, 480), 0, 0),
    ("stretch", "wide", 32): ((320, 480), (320, 480), 0, 0),  # stretch fills the input: no stride
    ("stretch", "tall", None): ((320, 480), (320, 480), 0, 0),
    ("stretch", "tall", 32): ((320, 480), (320, 480), 0, 0),
}


SHAPES = {"wide": (300, 517), "tall": (517, 333)}


def reference_tensor(
    image: np.ndarray, config: PreprocessConfig, geometry: tuple[tuple[int, int], tuple[int, int], int, int]
) -> np.ndarray:
    """The float input computed the plain way from hand-worked geometry: resize, pad a uint8
    canvas, reorder, normalise."""
    import cv2

    (h, w), (new_h, new_w), top, left = geometry
    canvas = np.full((h, w, 3), config.pad_value, np.uint8)
    canvas[top : top + new_h, left : left + new_w] = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    pixels = canvas[..., ::-1] if config.color == "RGB" else canvas
    values = (pixels.astype(np.float64) - config.mean) / config.std
    return (values.transpose(2, 0, 1) if config.layout == "NCHW" else values)[None]


@pytest.mark.parametrize("resize", ["letterbox", "letterbox-topleft", "stretch"])
@pytest.mark.parametrize(("color", "layout"), [("RGB", "NCHW"), ("BGR", "NHWC"), ("RGB", "NHWC")])
@pytest.mark.parametrize(("mean", "std", "rect_stride"), [(0.0, 255.0, None), (127.5, 127.5, 32)])
@pytest.mark.parametrize("shape", ["wide", "tall"])
def test_float_inputs_match_the_plain_computation(resize, color, layout, mean, std, rect_stride, shape) -> None:
    """The float path writes pixels straight into the tensor's interior and fills only the
    borders; every layout, order and normalisation must equal padding a canvas first, at the
    place worked out by hand, and the transform must say that place."""
    src_h, src_w = SHAPES[shape]
    image = np.random.default_rng(3).integers(0, 256, (src_h, src_w, 3), dtype=np.uint8)
    config = PreprocessConfig(
        size=(320, 480), resize=resize, color=color, layout=layout, mean=mean, std=std, rect_stride=rect_stride
    )
    tensor, transform = preprocess(image, config)
    geometry = GEOMETRY[(resize, shape, rect_stride)]
    input_hw, (new_h, new_w), top, left = geometry
    assert (transform.input_hw, transform.pad_y, transform.pad_x) == (input_hw, top, left)
    assert (transform.scale_x, transform.scale_y) == pytest.approx((new_w / src_w, new_h / src_h))
    expected = reference_tensor(image, config, geometry)
    assert tensor.dtype == np.float32 and tensor.shape == expected.shape
    np.testing.assert_allclose(tensor, expected, atol=1e-6)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_pixels_divided_as_ultralytics_divides_them(layout: str) -> None:
    """Bit for bit ``pixel / 255`` in float32, as Ultralytics' ``div_(255)``: times 1/255 is one
    unit in the last place off on about half the values, which an INT8 model turns into boxes a
    pixel apart from Ultralytics' (scripts/check_ultralytics_tasks.py)."""
    image = np.broadcast_to(np.arange(256, dtype=np.uint8).reshape(16, 16, 1), (16, 16, 3)).copy()
    tensor, _ = preprocess(image, PreprocessConfig(size=(16, 16), layout=layout))  # type: ignore[arg-type]
    planes = tensor[0] if layout == "NCHW" else tensor[0].transpose(2, 0, 1)
    expected = np.divide(image[..., 0], np.float32(255), dtype=np.float32)
    assert all(np.array_equal(plane, expected) for plane in planes)


@pytest.mark.parametrize("resize", ["letterbox", "letterbox-topleft"])
@pytest.mark.parametrize(("color", "layout"), [("RGB", "NCHW"), ("BGR", "NHWC")])
@pytest.mark.parametrize(
    ("dtype", "quant", "mean", "std"),
    [(np.int8, Quantization(0.02, -3), 10.0, 200.0), (np.uint8, Quantization(0.0078125, 128), 127.5, 127.5)],
)
@pytest.mark.parametrize("shape", ["wide", "tall"])
def test_quantized_inputs_match_the_plain_computation(resize, color, layout, dtype, quant, mean, std, shape) -> None:
    """The integer path (a padded canvas, then ``q = round(x / scale + zero_point)`` clipped to
    the dtype) equals the float reference quantized by hand, in every layout and order."""
    src_h, src_w = SHAPES[shape]
    image = np.random.default_rng(5).integers(0, 256, (src_h, src_w, 3), dtype=np.uint8)
    config = PreprocessConfig(
        size=(320, 480), resize=resize, color=color, layout=layout, mean=mean, std=std,
        dtype=np.dtype(dtype), quantization=quant,
    )  # fmt: skip
    tensor, _ = preprocess(image, config)
    real = reference_tensor(image, config, GEOMETRY[(resize, shape, None)])
    info = np.iinfo(dtype)
    expected = np.clip(np.rint(real / quant.scale + quant.zero_point), info.min, info.max)
    assert tensor.dtype == dtype and tensor.shape == expected.shape
    assert np.abs(tensor.astype(np.int32) - expected).max() <= 1  # float32 against float64 rounding
    assert (tensor.astype(np.int32) == expected).mean() > 0.95  # the rest are ties at .5


@pytest.mark.parametrize(
    ("config", "waits_as"),
    [
        (PreprocessConfig((320, 480)), np.uint8),
        (PreprocessConfig((320, 480), color="BGR", layout="NHWC", mean=127.5, std=127.5), np.uint8),
        (PreprocessConfig((320, 480), resize="letterbox-topleft", rect_stride=32), np.uint8),
        (PreprocessConfig((320, 480), resize="stretch", dtype=np.dtype(np.float16)), np.uint8),
        (PreprocessConfig((320, 480), dtype=np.dtype(np.int8), quantization=Quantization(0.02, -3)), np.int8),
        (PreprocessConfig((320, 480), dtype=np.dtype(np.uint8)), np.uint8),  # raw pixels: already compact
    ],
)
@pytest.mark.parametrize("shape", ["wide", "tall"])
def test_a_compact_tensor_normalised_is_the_prepared_one(config: PreprocessConfig, waits_as: type, shape: str) -> None:
    """What a frame holds while it waits for a shared model: a float input's uint8 pixels (a
    quarter or half of the bytes), which `normalise` turns into exactly `preprocess`'s tensor;
    integer inputs are `preprocess`'s own tensor, which `normalise` leaves as it is."""
    image = np.random.default_rng(7).integers(0, 256, (*SHAPES[shape], 3), dtype=np.uint8)
    expected, transform = preprocess(image, config)
    waiting, waiting_transform = compact(image, config)
    assert waiting.dtype == waits_as and waiting.shape == expected.shape and waiting_transform == transform
    assert waiting.nbytes == expected.nbytes // np.dtype(config.dtype).itemsize
    ready = normalise(waiting, config)
    assert ready.dtype == expected.dtype
    np.testing.assert_array_equal(ready, expected)
    batch = normalise(np.concatenate([waiting, waiting[..., ::-1]]), config)  # a batch at once
    np.testing.assert_array_equal(batch[:1], expected)
