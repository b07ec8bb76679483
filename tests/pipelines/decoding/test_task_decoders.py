"""`pipelines.decoding.task_decoders` on the shipped task models (agent/demo/demo_{segment,pose,obb}*)
through the real ONNX Runtime and LiteRT: answers close to the synthetic scene's truth, the same
answers from every form of a model (grid and end-to-end, ONNX pixels and TFLite 0..1
coordinates, prototypes channel-first and channel-last), outputs matched by shape not order; the
INT8 TFLite exports (head in float) close to the truth and to their FP32 siblings; and on hand-made
outputs, a row exactly at the threshold and a model input that is not square."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from testkit import DEMO_MODELS

from pipelines.decoding.decoders import DecoderError
from pipelines.decoding.detections import Detections
from pipelines.decoding.detector import Detector
from pipelines.decoding.nms import box_iou
from pipelines.decoding.rotated import corners
from pipelines.decoding.task_decoders import (
    decode_end2end_obb,
    decode_end2end_pose,
    decode_end2end_seg,
    decode_yolov8_pose,
    decode_yolov8_seg,
    prototype_planes,
)
from pipelines.sources.frames import GroundTruth
from pipelines.sources.synthetic import SyntheticScene
from runtimes.registry import load_runtime

#: evaluation scenes: seeds far from training (below 100000) and calibration (200000)
SEEDS = (310_001, 310_002, 310_003)


def _detector(name: str) -> Iterator[Detector]:
    path = DEMO_MODELS / name
    with load_runtime("onnxruntime" if path.suffix == ".onnx" else "litert", Path(path)) as runtime:
        yield Detector(runtime)


@pytest.fixture(scope="module")
def frames() -> list[tuple[np.ndarray, GroundTruth]]:
    """640x480 frames (the letterbox pads 40 rows above and below at 320) and a 480x640 one."""
    sizes = ((640, 480), (640, 480), (480, 640))
    return [
        SyntheticScene(w, h, num_shapes=5, seed=seed).render(3, masks=True)
        for (w, h), seed in zip(sizes, SEEDS, strict=True)
    ]


def _run(name: str, frames: list[tuple[np.ndarray, GroundTruth]]) -> tuple[str, list[Detections]]:
    for detector in _detector(name):
        return detector.decoder, [detector.detect(image) for image, _ in frames]
    raise AssertionError("unreachable")


def _match(found: Detections, truth: GroundTruth, cls: int | None = None) -> list[tuple[int, int]]:
    """(found, truth) pairs: each detection with the truth box it overlaps best (IoU > 0.5)."""
    t = truth.detections
    out = []
    for i, box in enumerate(found.xyxy):
        w = np.clip(np.minimum(box[2], t.xyxy[:, 2]) - np.maximum(box[0], t.xyxy[:, 0]), 0, None)
        h = np.clip(np.minimum(box[3], t.xyxy[:, 3]) - np.maximum(box[1], t.xyxy[:, 1]), 0, None)
        area = (box[2] - box[0]) * (box[3] - box[1]) + (t.xyxy[:, 2] - t.xyxy[:, 0]) * (t.xyxy[:, 3] - t.xyxy[:, 1])
        iou = w * h / (area - w * h)
        if cls is not None:
            iou = np.where(t.class_id == cls, iou, 0)
        if iou.max() > 0.5:
            out.append((i, int(iou.argmax())))
    return out


def _same(a: Detections, b: Detections, pixels: float) -> None:
    assert a.class_id.tolist() == b.class_id.tolist()
    np.testing.assert_allclose(a.confidence, b.confidence, atol=0.01)
    np.testing.assert_allclose(a.xyxy, b.xyxy, atol=pixels)


@pytest.mark.parametrize("name", ["demo_segment.onnx", "demo_segment_int8.tflite"])
def test_segment_masks_cover_the_shapes_in_frame_pixels(
    frames: list[tuple[np.ndarray, GroundTruth]], name: str
) -> None:
    """Masks against each shape's visible pixels: with the letterbox left in (40 rows at 320,
    80 in the frame) or the box crop skipped they would not overlap this well."""
    decoder, found = _run(name, frames)
    assert decoder == "yolov8-seg"
    ious = []
    for detections, (_, truth) in zip(found, frames, strict=True):
        assert detections.masks is not None and detections.masks.shape == truth.masks.shape[1:]  # type: ignore[union-attr]
        for i, j in _match(detections, truth):
            mask, shown = detections.masks.bitmap(i), truth.masks[j]  # type: ignore[index]
            ious.append((mask & shown).sum() / (mask | shown).sum())
            polygon = detections.masks.outline(i, 64)[0]
            cx, cy = polygon.mean(axis=0)
            x1, y1, x2, y2 = truth.detections.xyxy[j]
            assert x1 - 4 <= cx <= x2 + 4 and y1 - 4 <= cy <= y2 + 4  # the outline lies on the shape
    assert len(ious) >= 8
    assert float(np.median(ious)) > 0.75, ious


@pytest.mark.parametrize("other", ["demo_segment_fp32.tflite"])
def test_tflite_segment_reads_normalised_boxes_and_channel_last_prototypes(
    frames: list[tuple[np.ndarray, GroundTruth]], other: str
) -> None:
    _, onnx = _run("demo_segment.onnx", frames)
    decoder, lite = _run(other, frames)
    assert decoder == "yolov8-seg"
    for a, b in zip(onnx, lite, strict=True):
        _same(a, b, pixels=1.0)
        for i in range(len(a)):
            x, y = a.masks.bitmap(i), b.masks.bitmap(i)  # type: ignore[union-attr]
            assert (x & y).sum() / max((x | y).sum(), 1) > 0.95


@pytest.mark.parametrize("name", ["demo_segment_e2e.onnx", "demo_segment_e2e_fp32.tflite"])
def test_end_to_end_segment_rows_decode(frames: list[tuple[np.ndarray, GroundTruth]], name: str) -> None:
    decoder, found = _run(name, frames)
    assert decoder == "end2end-seg"
    matched = 0
    for detections, (_, truth) in zip(found, frames, strict=True):
        for i, j in _match(detections, truth):
            mask, shown = detections.masks.bitmap(i), truth.masks[j]  # type: ignore[union-attr,index]
            matched += (mask & shown).sum() / (mask | shown).sum() > 0.6
    assert matched >= 8


def _keypoint_errors(found: Detections, truth: GroundTruth) -> list[float]:
    """Per matched triangle, the largest distance of its visible vertices to the keypoints (the
    vertex order is the model's: the best of the three turns)."""
    errors = []
    assert found.keypoints is not None and truth.keypoints is not None
    for i, j in _match(found, truth, cls=2):
        vertices = truth.keypoints[j]
        visible = vertices[:, 2] > 0
        best = min(
            float(
                np.linalg.norm(np.roll(found.keypoints[i, :, :2], k, axis=0) - vertices[:, :2], axis=1)[visible].max()
            )
            for k in range(3)
        )
        errors.append(best)
    return errors


@pytest.mark.parametrize(
    "name",
    [
        "demo_pose.onnx",
        "demo_pose_fp32.tflite",
        "demo_pose_e2e.onnx",
        "demo_pose_e2e_fp32.tflite",
        "demo_pose_int8.tflite",
    ],
)
def test_pose_keypoints_land_on_the_triangles_vertices(frames: list[tuple[np.ndarray, GroundTruth]], name: str) -> None:
    """In frame pixels: TFLite's 0..1 keypoints scaled back, the letterbox's rows removed (either
    would put them tens of pixels off)."""
    decoder, found = _run(name, frames)
    assert decoder == ("end2end-pose" if "e2e" in name else "yolov8-pose")
    errors = [
        e for detections, (_, truth) in zip(found, frames, strict=True) for e in _keypoint_errors(detections, truth)
    ]
    assert len(errors) >= 2
    assert float(np.median(errors)) < 25, errors  # the small model: about 15 px in a 640x480 frame
    for detections in found:
        assert detections.keypoints is not None and detections.keypoints.shape[1:] == (3, 3)
        assert ((detections.keypoints[..., 2] >= 0) & (detections.keypoints[..., 2] <= 1)).all()


def test_pose_tflite_gives_the_onnx_keypoints(frames: list[tuple[np.ndarray, GroundTruth]]) -> None:
    _, onnx = _run("demo_pose.onnx", frames)
    _, lite = _run("demo_pose_fp32.tflite", frames)
    for a, b in zip(onnx, lite, strict=True):
        _same(a, b, pixels=1.0)
        np.testing.assert_allclose(a.keypoints, b.keypoints, atol=1.0)  # type: ignore[arg-type]


def _corner_errors(found: Detections, truth: GroundTruth) -> list[float]:
    assert found.xywhr is not None and truth.obb is not None
    errors = []
    for i, j in _match(found, truth):
        if truth.detections.class_id[j] != 1:  # squares: one rotated box (circles have no angle, triangles three)
            continue
        mine, theirs = corners(found.xywhr[i : i + 1])[0], corners(truth.obb[j : j + 1])[0]
        errors.append(min(float(np.linalg.norm(np.roll(mine, k, axis=0) - theirs, axis=1).max()) for k in range(4)))
    return errors


@pytest.mark.parametrize(
    "name",
    ["demo_obb.onnx", "demo_obb_fp32.tflite", "demo_obb_e2e.onnx", "demo_obb_e2e_fp32.tflite", "demo_obb_int8.tflite"],
)
def test_oriented_boxes_fit_the_squares(frames: list[tuple[np.ndarray, GroundTruth]], name: str) -> None:
    decoder, found = _run(name, frames)
    assert decoder == ("end2end-obb" if "e2e" in name else "yolov8-obb")
    errors = [
        e for detections, (_, truth) in zip(found, frames, strict=True) for e in _corner_errors(detections, truth)
    ]
    assert len(errors) >= 3
    assert float(np.median(errors)) < 25, errors  # the small model: about 15 px on 100 px squares
    for detections in found:
        assert detections.xywhr is not None
        # xyxy stays the axis-aligned box around the corners (tracking reads it)
        points = corners(detections.xywhr)
        np.testing.assert_allclose(detections.xyxy[:, :2], np.clip(points.min(axis=1), 0, None), atol=0.01)


def _pairs(a: Detections, b: Detections) -> list[tuple[int, int]]:
    """(a, b) pairs of the same class at box IoU > 0.5, greedily by a's confidence."""
    out: list[tuple[int, int]] = []
    free = np.ones(len(b), bool)
    for i in np.argsort(-a.confidence):
        iou = np.where(free & (b.class_id == a.class_id[i]), box_iou(a.xyxy[i], b.xyxy), 0)
        if len(b) and iou.max() > 0.5:
            j = int(iou.argmax())
            free[j] = False
            out.append((int(i), j))
    return out


def _mask_iou(a: Detections, i: int, b: Detections, j: int) -> float:
    x, y = a.masks.bitmap(i), b.masks.bitmap(j)  # type: ignore[union-attr]
    return float((x & y).sum() / max((x | y).sum(), 1))


def _keypoint_px(a: Detections, i: int, b: Detections, j: int) -> float:
    return float(np.linalg.norm(a.keypoints[i, :, :2] - b.keypoints[j, :, :2], axis=1).max())  # type: ignore[index]


def _corner_px(a: Detections, i: int, b: Detections, j: int) -> float:
    p, q = corners(a.xywhr[i : i + 1])[0], corners(b.xywhr[j : j + 1])[0]  # type: ignore[index]
    return min(float(np.linalg.norm(p - np.roll(q, k, axis=0), axis=1).max()) for k in range(4))


#: INT8 file -> (FP32 sibling, its task's field, the closeness of a pair, median bound, its sense).
#: Measured on these frames: all FP32 detections paired (19, 3 and 17); median mask IoU 0.996,
#: keypoints 0.76 px, corners 0.32 px (worst 0.92, 3.5 px, 7.9 px)
INT8 = {
    "demo_segment_int8.tflite": ("demo_segment_fp32.tflite", "masks", _mask_iou, 0.95, "above"),
    "demo_pose_int8.tflite": ("demo_pose_fp32.tflite", "keypoints", _keypoint_px, 2.0, "below"),
    "demo_obb_int8.tflite": ("demo_obb_fp32.tflite", "xywhr", _corner_px, 1.5, "below"),
}


@pytest.mark.parametrize(("name", "case"), INT8.items())
def test_int8_tflite_answers_as_its_fp32_sibling(
    frames: list[tuple[np.ndarray, GroundTruth]], name: str, case: tuple[str, str, Any, float, str]
) -> None:
    """The INT8 exports keep float input and outputs (int8 inside, the head in float): the agent
    feeds them as the FP32 file and reads the task's field; their detections pair with FP32's
    (same class, box IoU > 0.5) and their masks, keypoints or corners lie close."""
    sibling, field, closeness, bound, sense = case
    with load_runtime("litert", DEMO_MODELS / name) as runtime:
        assert [s.dtype for s in runtime.inputs + runtime.outputs] == [np.float32] * (1 + len(runtime.outputs))
    assert (DEMO_MODELS / name).stat().st_size < 0.7 * (DEMO_MODELS / sibling).stat().st_size  # int8 weights
    _, lite = _run(sibling, frames)
    _, int8 = _run(name, frames)
    paired, expected, values = 0, 0, []
    for a, b in zip(lite, int8, strict=True):
        assert getattr(b, field) is not None
        matched = _pairs(a, b)
        paired += len(matched)
        expected += len(a)
        values += [closeness(a, i, b, j) for i, j in matched]
    assert expected >= 3 and paired >= 0.9 * expected, (paired, expected)
    median = float(np.median(values))
    assert median > bound if sense == "above" else median < bound, values


def test_outputs_are_matched_by_shape_not_order() -> None:
    """TensorRT may give the prototypes first: the same detections and masks."""
    image, _ = SyntheticScene(num_shapes=5, seed=SEEDS[0]).render(3)
    for detector in _detector("demo_segment.onnx"):
        tensor, _ = detector.prepare(image)
        outputs = detector.infer(tensor)
        assert [o.ndim for o in outputs] == [3, 4]
        a = decode_yolov8_seg(outputs, (320, 320), 0.25)
        b = decode_yolov8_seg(outputs[::-1], (320, 320), 0.25)
        assert len(a) > 0
        np.testing.assert_array_equal(a.xyxy, b.xyxy)
        np.testing.assert_array_equal(a.masks.coefficients, b.masks.coefficients)  # type: ignore[union-attr]


def test_prototypes_in_either_channel_order() -> None:
    nchw = np.random.default_rng(1).normal(size=(1, 32, 80, 60)).astype(np.float32)
    np.testing.assert_array_equal(prototype_planes(nchw, (320, 240)), nchw[0])
    np.testing.assert_array_equal(prototype_planes(nchw.transpose(0, 2, 3, 1), (320, 240)), nchw[0])
    with pytest.raises(DecoderError, match=r"fit neither \(1, nm, h, w\) nor \(1, h, w, nm\) for a 100x100 input"):
        prototype_planes(nchw, (100, 100))


#: a model input wider than high (H, W): an axis swapped anywhere shows
WIDE_HW = (256, 320)


def _end2end_outputs(decoder: str, scores: list[float]) -> list[np.ndarray]:
    """Hand-made end-to-end outputs of one row per score (input pixels), with the task's extra
    values: 2 mask coefficients and their prototypes, 1 keypoint of x, y, score, or an angle."""
    rows = np.zeros((1, 10, {"seg": 8, "pose": 9, "obb": 7}[decoder]), np.float32)
    for i, score in enumerate(scores):
        if decoder == "obb":
            rows[0, i, :7] = [100 + 20 * i, 100, 40, 20, score, i, 0.3]
        else:
            rows[0, i, :6] = [20 + 40 * i, 30, 50 + 40 * i, 70, score, i]
            rows[0, i, 6:] = [0.5, -0.5, 0.9] if decoder == "pose" else [0.5, -0.5]
    if decoder == "seg":
        return [rows, np.zeros((1, 2, WIDE_HW[0] // 4, WIDE_HW[1] // 4), np.float32)]
    return [rows]


@pytest.mark.parametrize("decoder", ["seg", "pose", "obb"])
def test_an_end_to_end_row_exactly_at_the_confidence_threshold_is_left_out(decoder: str) -> None:
    """'Above conf', as the grid and query decoders do it. Catches the planted `>=` in
    `_end2end_common` (a row scoring exactly `conf` kept)."""
    decode = {"seg": decode_end2end_seg, "pose": decode_end2end_pose, "obb": decode_end2end_obb}[decoder]
    kwargs: dict[str, Any] = {"kpt_shape": (1, 3)} if decoder == "pose" else {}
    found = decode(_end2end_outputs(decoder, [0.5, 0.75, 0.25]), WIDE_HW, 0.5, **kwargs)
    assert found.class_id.tolist() == [1] and found.confidence.tolist() == [0.75]


def test_normalised_keypoints_scale_x_by_the_width_and_y_by_the_height() -> None:
    """A pose model whose input is not square (256 high, 320 wide), its coordinates 0..1 (TFLite):
    x is scaled by the width and y by the height, in the grid and end-to-end forms alike. Catches
    the planted swap in `_scale_keypoints` (x by the height, y by the width), which every square
    input (the shipped models' 320x320) hides."""
    grid = np.zeros((1, 4 + 1 + 3, 16), np.float32)  # (1, 4+nc+K*d, N): one class, one keypoint x, y, score
    grid[0, :, 3] = [0.5, 0.5, 0.25, 0.5, 0.9, 0.25, 0.75, 0.8]
    rows = np.zeros((1, 10, 6 + 3), np.float32)  # x1 y1 x2 y2 score class, then the keypoint
    rows[0, 0] = [0.375, 0.25, 0.625, 0.75, 0.9, 0, 0.25, 0.75, 0.8]
    for found in (
        decode_yolov8_pose([grid], WIDE_HW, 0.5, kpt_shape=(1, 3)),
        decode_end2end_pose([rows], WIDE_HW, 0.5, kpt_shape=(1, 3)),
    ):
        assert found.keypoints is not None
        np.testing.assert_allclose(found.xyxy, [[120, 64, 200, 192]])
        np.testing.assert_allclose(found.keypoints, [[[80, 192, 0.8]]])
