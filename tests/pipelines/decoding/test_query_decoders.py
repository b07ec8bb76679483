"""`pipelines.decoding.query_decoders`: end2end, RT-DETR and DETR-style outputs in every variant."""

from __future__ import annotations

import numpy as np
import pytest
from testkit.decoder_outputs import HW, ROWS, end2end_output, rtdetr_output, rtdetr_rows

from pipelines.decoding import query_decoders as q
from pipelines.decoding.decoders import DecoderError


@pytest.mark.parametrize(
    ("normalised", "batch_index", "class_first"),
    [(False, False, False), (True, False, False), (False, True, False), (False, False, True), (True, True, True)],
)
def test_end2end_rows_decode_in_every_variant(normalised: bool, batch_index: bool, class_first: bool) -> None:
    found = q.decode_end2end([end2end_output(normalised, batch_index, class_first)], HW, 0.25).sorted_by_confidence()
    np.testing.assert_allclose(found.xyxy, [r[:4] for r in ROWS], atol=1e-3)
    assert found.confidence.tolist() == pytest.approx([0.9, 0.6])
    assert found.class_id.tolist() == [15, 2]


def test_end2end_all_padding_is_empty() -> None:
    assert len(q.decode_end2end([np.zeros((1, 300, 6), np.float32)], HW, 0.25)) == 0


def test_end2end_wrong_width_names_the_shape() -> None:
    with pytest.raises(DecoderError, match=r"rows of 6 values .* got \(1, 300, 8\)"):
        q.decode_end2end([np.zeros((1, 300, 8), np.float32)], HW, 0.25)


@pytest.mark.parametrize(
    ("output", "fits"),
    [
        (end2end_output(), True),
        (end2end_output(batch_index=True), True),
        (end2end_output(class_first=True), True),
        (np.zeros((1, 300, 6), np.float32), True),  # an nms=True export on a blank frame: all padding
        (end2end_output()[:, :, [2, 1, 0, 3, 4, 5]], False),  # x1 and x2 swapped: boxes not ordered
        (np.random.default_rng(1).uniform(0, 1, (1, 300, 6)).astype(np.float32), False),  # RT-DETR, nc = 2
        (np.concatenate([end2end_output()] * 5, axis=1), False),  # 1500 rows: a grid, not queries
        (end2end_output()[0], False),  # no batch axis
    ],
)
def test_end2end_evidence(output: np.ndarray, fits: bool) -> None:
    assert (q.end2end_evidence([output]) is not None) == fits


def test_rtdetr_evidence_tells_rows_from_end2end_and_class_scores() -> None:
    assert q.rtdetr_evidence([rtdetr_rows()]) is not None
    assert q.rtdetr_evidence([end2end_output(normalised=True)]) is None  # ordered corners: end2end
    assert q.rtdetr_evidence([rtdetr_output(2)]) is None  # class scores, not whole numbers


def test_rtdetr_score_and_class_rows() -> None:
    found = q.decode_rtdetr([rtdetr_rows()], (384, 640), 0.25)
    np.testing.assert_allclose(found.xyxy, [[240, 96, 400, 288]], atol=1e-3)
    assert found.class_id.tolist() == [1] and found.confidence.tolist() == pytest.approx([0.8])


def test_rtdetr_normalised_cxcywh_to_input_pixels() -> None:
    found = q.decode_rtdetr([rtdetr_output()], (384, 640), 0.25)
    np.testing.assert_allclose(found.xyxy, [[240, 96, 400, 288]], atol=1e-3)
    assert found.class_id.tolist() == [1] and found.confidence.tolist() == pytest.approx([0.8])


def detr_outputs(columns: int, queries: int = 100, softmax: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """boxes (1, Q, 4) with one object at query 3 (class 5), logits (1, Q, columns)."""
    rng = np.random.default_rng(3)
    boxes = rng.uniform(0.2, 0.4, (1, queries, 4)).astype(np.float32)
    boxes[0, 3] = [0.5, 0.25, 0.5, 0.5]
    logits = rng.uniform(-9, -6, (1, queries, columns)).astype(np.float32)
    if softmax:
        logits[0, :, -1] = 4.0  # "no object" wins everywhere ...
    logits[0, 3, min(5, columns - 2)] = 6.0  # ... but at query 3
    return boxes, logits


def test_detr_sigmoid_scores_in_either_output_order() -> None:
    boxes, logits = detr_outputs(91)
    assert q.detr_scores([boxes, logits]) == ("sigmoid", "independent class logits")
    for outputs in ([boxes, logits], [logits, boxes]):
        found = q.decode_detr(outputs, HW, 0.5, "sigmoid")
        np.testing.assert_allclose(found.xyxy, [[160, 0, 480, 320]], atol=1e-3)
        assert found.class_id.tolist() == [5] and found.confidence[0] == pytest.approx(1 / (1 + np.exp(-6.0)))


def test_detr_softmax_with_a_no_object_column() -> None:
    boxes, logits = detr_outputs(92, softmax=True)
    mode, why = q.detr_scores([boxes, logits])
    assert mode == "softmax" and "no object" in why
    found = q.decode_detr([boxes, logits], HW, 0.5, mode)
    assert found.class_id.tolist() == [5] and found.confidence[0] > 0.8
    # read with sigmoid, the "no object" column would be detected in every query
    assert len(q.decode_detr([boxes, logits], HW, 0.5, "sigmoid")) == 100


def test_detr_scores_from_the_named_class_count_and_from_probabilities() -> None:
    boxes, logits = detr_outputs(3)
    assert q.detr_scores([boxes, logits], num_classes=2)[0] == "softmax"
    assert q.detr_scores([boxes, logits], num_classes=3)[0] == "sigmoid"
    assert q.detr_scores([boxes, 1 / (1 + np.exp(-logits))])[0] == "probabilities"


@pytest.mark.parametrize("shapes", [[(1, 100, 4)], [(1, 100, 4), (1, 90, 91)], [(1, 100, 5), (1, 100, 91)]])
def test_detr_refuses_other_shapes(shapes) -> None:
    with pytest.raises(DecoderError, match="detr expects two outputs"):
        q.decode_detr([np.zeros(s, np.float32) for s in shapes], HW, 0.5)


def test_detr_with_four_classes_tells_the_boxes_by_their_unit_range() -> None:
    """Both outputs (1, Q, 4): the boxes are the one whose values lie in 0..1, in either order."""
    boxes = np.array([[[0.5, 0.5, 0.2, 0.4], [0.1, 0.1, 0.1, 0.1]]], np.float32)
    logits = np.array([[[-9.0, 3.0, -9.0, -9.0], [-9.0, -9.0, -9.0, -9.0]]], np.float32)
    for outputs in ([boxes, logits], [logits, boxes]):
        found = q.decode_detr(outputs, (100, 200), 0.5, "sigmoid")
        np.testing.assert_allclose(found.xyxy, [[80, 30, 120, 70]], atol=1e-3)
        assert found.class_id.tolist() == [1]


def test_detr_softmax_and_probabilities_by_hand() -> None:
    """One query, three class values and a 'no object' column: softmax by hand; probabilities
    are taken as they are; sigmoid is the default."""
    boxes = np.array([[[0.5, 0.5, 0.5, 0.5]]], np.float32)
    values = np.array([[[2.0, 0.0, 0.0, 1.0]]], np.float32)  # exp: e^2, 1, 1, e
    softmax = q.decode_detr([boxes, values], HW, 0.1, "softmax")
    assert softmax.class_id.tolist() == [0]
    assert softmax.confidence[0] == pytest.approx(np.e**2 / (np.e**2 + 2 + np.e), rel=1e-5)
    probabilities = q.decode_detr([boxes, np.array([[[0.3, 0.6, 0.1]]], np.float32)], HW, 0.1, "probabilities")
    assert probabilities.class_id.tolist() == [1] and probabilities.confidence[0] == pytest.approx(0.6)
    default = q.decode_detr([boxes, values], HW, 0.1)
    assert default.confidence[0] == pytest.approx(1 / (1 + np.exp(-2.0)), rel=1e-5)
    # large logits do not overflow: softmax subtracts each row's largest value first
    huge = q.decode_detr([boxes, values * 60], HW, 0.1, "softmax")
    assert huge.confidence[0] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(
    "shapes",
    [
        [(1, 100, 4)],
        [(1, 100, 4), (1, 90, 91)],
        [(1, 100, 5), (1, 100, 91)],
        [(2, 100, 4), (2, 100, 91)],
        [(1, 100, 4), (100, 91)],
    ],
)
def test_detr_refusals_name_the_shapes(shapes) -> None:
    with pytest.raises(DecoderError) as refused:
        q.decode_detr([np.zeros(s, np.float32) for s in shapes], HW, 0.5)
    assert str(refused.value) == (
        f"detr expects two outputs, boxes (1, Q, 4) and class values (1, Q, C), got {[tuple(s) for s in shapes]}"
    )


def test_rtdetr_with_one_class_column() -> None:
    """(1, Q, 4 + 1): one class, its score already in 0..1 (5 columns are not `score, class`)."""
    out = np.zeros((1, 3, 5), np.float32)
    out[0, 0] = [0.5, 0.5, 0.25, 0.5, 0.7]
    found = q.decode_rtdetr([out], (384, 640), 0.25)
    np.testing.assert_allclose(found.xyxy, [[240, 96, 400, 288]], atol=1e-3)
    assert found.class_id.tolist() == [0] and found.confidence.tolist() == pytest.approx([0.7])


@pytest.mark.parametrize(
    ("decode", "outputs", "message"),
    [
        (
            q.decode_rtdetr,
            [np.zeros((1, 300, 4))],
            "rtdetr expects rows of 4 box values and class scores, got (1, 300, 4)",
        ),
        (q.decode_rtdetr, [np.zeros((1, 300, 6))] * 2, "rtdetr expects one output, the model has 2"),
        (q.decode_end2end, [np.zeros((1, 300, 6))] * 2, "end2end expects one output, the model has 2"),
        (q.decode_end2end, [np.zeros((1, 300, 5))], "end2end expects rows of 6 values (x1, y1, x2, y2, score, class)"),
    ],
)
def test_query_decoder_refusals_name_the_decoder_and_the_shape(decode, outputs, message: str) -> None:
    with pytest.raises(DecoderError) as refused:
        decode(outputs, HW, 0.25)
    assert str(refused.value).startswith(message), refused.value


def test_a_query_exactly_at_the_confidence_threshold_is_left_out() -> None:
    """'Above conf', as the grid decoders do it."""
    rows = np.array([[[10, 10, 50, 50, 0.5, 1], [60, 60, 90, 90, 0.51, 2]]], np.float32)
    assert q.decode_end2end([rows], HW, 0.5).class_id.tolist() == [2]
    detr = q.decode_detr(
        [np.full((1, 1, 4), 0.5, np.float32), np.array([[[0.5, 0.2]]], np.float32)], HW, 0.5, "probabilities"
    )
    assert len(detr) == 0


def test_end2end_rows_with_whole_scores_read_score_then_class() -> None:
    """When both columns hold whole numbers (a score of exactly 1), Ultralytics' order stands."""
    rows = np.array([[[10, 10, 50, 50, 1, 7], [60, 60, 90, 90, 0, 3]]], np.float32)
    found = q.decode_end2end([rows], HW, 0.5)
    assert found.class_id.tolist() == [7] and found.confidence.tolist() == [1.0]
