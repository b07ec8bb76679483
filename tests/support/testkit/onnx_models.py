"""Rewriting real ONNX detectors into other exporters' layouts, with the `onnx` helper.

`rewrite` appends nodes after a model's ``output0``. The builders below reproduce, as ONNX
graphs on top of the real YOLOv8n ``(1, 84, 8400)`` output, what Ultralytics' exporters append
(their code read at ultralytics/engine/exporter.py ``NMSModel`` and the end-to-end head's
top-k post-process), with the metadata those exports carry.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NC = 80
ANCHORS = 8400
K = 300
#: the args Ultralytics 8.4 writes for an ONNX export (``nms`` set per variant)
ULTRALYTICS_ARGS = (
    "{{'data': None, 'batch': 1, 'fraction': 1.0, 'quantize': None, 'dynamic': False, 'simplify': True, "
    "'opset': None, 'nms': {nms}}}"
)


def rewrite(
    source: Path,
    target: Path,
    tail: list,
    extra_init: list,
    out_shape: list,
    keep_metadata: bool = True,
    metadata: dict[str, str] | None = None,
    raw: str = "raw0",
) -> Path:
    """Append `tail` nodes after `output0` (renamed `raw`) and make their result the only output
    (``output0``); `metadata` entries replace or add to the source's."""
    model = onnx.load(str(source))
    graph = model.graph
    graph.output[0].name = raw
    for node in graph.node:
        node.output[:] = [raw if o == "output0" else o for o in node.output]
    graph.node.extend(tail)
    graph.initializer.extend(extra_init)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("output0", TensorProto.FLOAT, out_shape))
    props = {p.key: p.value for p in model.metadata_props} if keep_metadata else {}
    props.update(metadata or {})
    del model.metadata_props[:]
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(target))
    return target


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value, name)


def _boxes_and_scores() -> tuple[list, list]:
    """Nodes: ``raw0 (1, 84, 8400)`` -> ``xyxy (1, 8400, 4)`` in input pixels and ``scores (1, 8400, 80)``."""
    nodes = [
        helper.make_node("Transpose", ["raw0"], ["rows"], perm=[0, 2, 1]),
        helper.make_node("Split", ["rows", "split_4_80"], ["cxcywh", "scores"], axis=2),
        helper.make_node("Split", ["cxcywh", "split_2_2"], ["centre", "size"], axis=2),
        helper.make_node("Mul", ["size", "half"], ["half_size"]),
        helper.make_node("Sub", ["centre", "half_size"], ["top_left"]),
        helper.make_node("Add", ["centre", "half_size"], ["bottom_right"]),
        helper.make_node("Concat", ["top_left", "bottom_right"], ["xyxy"], axis=2),
    ]
    inits = [
        _const("split_4_80", np.array([4, NC], np.int64)),
        _const("split_2_2", np.array([2, 2], np.int64)),
        _const("half", np.array(0.5, np.float32)),
    ]
    return nodes, inits


def _gather_rows(source: str, index: str, width: int, out: str) -> list:
    """Nodes: rows ``index (1, K)`` of ``source (1, N, width)`` -> ``out (1, K, width)``."""
    return [
        helper.make_node("Unsqueeze", [index, "axis2"], [f"{out}_idx3"]),
        helper.make_node("Expand", [f"{out}_idx3", f"shape_{width}"], [f"{out}_idx"]),
        helper.make_node("GatherElements", [source, f"{out}_idx"], [out], axis=1),
    ]


def end2end_topk(
    source: Path, target: Path, metadata: dict[str, str] | None = None, keep_metadata: bool = True
) -> Path:
    """The end-to-end post-process of YOLOv10 / YOLO26 exports: the top K anchors by best class
    score, then the top K (anchor, class) pairs among them; rows ``x1, y1, x2, y2, score, class``
    in input pixels, no NMS -> ``(1, 300, 6)``."""
    nodes, inits = _boxes_and_scores()
    nodes += [
        helper.make_node("ReduceMax", ["scores", "axis2"], ["best"], keepdims=0),
        helper.make_node("TopK", ["best", "k"], ["_top_best", "anchor_idx"], axis=1),
        *_gather_rows("xyxy", "anchor_idx", 4, "top_boxes"),
        *_gather_rows("scores", "anchor_idx", NC, "top_scores"),
        helper.make_node("Reshape", ["top_scores", "flat_shape"], ["flat"]),
        helper.make_node("TopK", ["flat", "k"], ["score", "flat_idx"], axis=1),
        helper.make_node("Div", ["flat_idx", "nc"], ["row"]),
        helper.make_node("Mod", ["flat_idx", "nc"], ["class_i"]),
        *_gather_rows("top_boxes", "row", 4, "boxes"),
        helper.make_node("Unsqueeze", ["score", "axis2"], ["score3"]),
        helper.make_node("Cast", ["class_i"], ["class_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["class_f", "axis2"], ["class3"]),
        helper.make_node("Concat", ["boxes", "score3", "class3"], ["output0"], axis=2),
    ]
    inits += [
        _const("axis2", np.array([2], np.int64)),
        _const("k", np.array([K], np.int64)),
        _const("shape_4", np.array([1, K, 4], np.int64)),
        _const(f"shape_{NC}", np.array([1, K, NC], np.int64)),
        _const("flat_shape", np.array([1, K * NC], np.int64)),
        _const("nc", np.array(NC, np.int64)),
    ]
    meta = {"end2end": "True", "args": ULTRALYTICS_ARGS.format(nms=False)} if keep_metadata else {}
    return rewrite(source, target, nodes, inits, [1, K, 6], keep_metadata, {**meta, **(metadata or {})})


def nms_export(source: Path, target: Path, conf: float = 0.25, iou: float = 0.45, scale: float = 1.0) -> Path:
    """Ultralytics ``export(nms=True)``: class-aware NMS inside the graph (boxes offset by class,
    as ``NMSModel`` does), rows ``x1, y1, x2, y2, score, class`` zero-padded to 300 -> ``(1, 300, 6)``;
    boxes times `scale` (``1 / 640``: normalised, as the TFLite export writes them)."""
    nodes, inits = _boxes_and_scores()
    nodes += [
        helper.make_node("ReduceMax", ["scores", "axis2"], ["best"], keepdims=0),
        helper.make_node("ArgMax", ["scores"], ["cls"], axis=2, keepdims=0),
        helper.make_node("Cast", ["cls"], ["cls_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["cls_f", "axis2"], ["cls3"]),
        helper.make_node("Div", ["xyxy", "imgsz"], ["unit_boxes"]),
        helper.make_node("Add", ["unit_boxes", "cls3"], ["nms_boxes"]),
        helper.make_node("Unsqueeze", ["best", "axis1"], ["nms_scores"]),
        helper.make_node("NonMaxSuppression", ["nms_boxes", "nms_scores", "k", "iou", "conf"], ["selected"]),
        helper.make_node("Gather", ["selected", "two"], ["keep"], axis=1),
        helper.make_node("Squeeze", ["xyxy", "axis0"], ["xyxy2"]),
        helper.make_node("Squeeze", ["best", "axis0"], ["best1"]),
        helper.make_node("Squeeze", ["cls3", "axis0"], ["cls2"]),
        helper.make_node("Gather", ["xyxy2", "keep"], ["kept_boxes_px"], axis=0),
        helper.make_node("Mul", ["kept_boxes_px", "box_scale"], ["kept_boxes"]),
        helper.make_node("Gather", ["best1", "keep"], ["kept_scores"], axis=0),
        helper.make_node("Unsqueeze", ["kept_scores", "axis1"], ["kept_scores2"]),
        helper.make_node("Gather", ["cls2", "keep"], ["kept_cls"], axis=0),
        helper.make_node("Concat", ["kept_boxes", "kept_scores2", "kept_cls"], ["dets"], axis=1),
        helper.make_node("Shape", ["dets"], ["dets_shape"]),
        helper.make_node("Gather", ["dets_shape", "zero"], ["count"], axis=0),
        helper.make_node("Sub", ["k", "count"], ["missing"]),
        helper.make_node("Concat", ["zeros2", "missing", "zero"], ["pads"], axis=0),
        helper.make_node("Pad", ["dets", "pads"], ["padded"]),
        helper.make_node("Unsqueeze", ["padded", "axis0"], ["output0"]),
    ]
    inits += [
        _const("axis0", np.array([0], np.int64)),
        _const("axis1", np.array([1], np.int64)),
        _const("axis2", np.array([2], np.int64)),
        _const("two", np.array(2, np.int64)),
        _const("zero", np.array([0], np.int64)),
        _const("zeros2", np.array([0, 0], np.int64)),
        _const("k", np.array([K], np.int64)),
        _const("iou", np.array([iou], np.float32)),
        _const("conf", np.array([conf], np.float32)),
        _const("imgsz", np.array(640.0, np.float32)),
        _const("box_scale", np.array(scale, np.float32)),
    ]
    meta = {"args": ULTRALYTICS_ARGS.format(nms=True)}
    return rewrite(source, target, nodes, inits, [1, K, 6], metadata=meta)


def with_batch_index(source: Path, target: Path) -> Path:
    """An end-to-end model whose rows gain a batch index first -> ``(1, 300, 7)``, no metadata."""
    nodes = [helper.make_node("Concat", ["batch_column", "rows6"], ["output0"], axis=2)]
    inits = [_const("batch_column", np.zeros((1, K, 1), np.float32))]
    return rewrite(source, target, nodes, inits, [1, K, 7], keep_metadata=False, raw="rows6")


def nonsense(source: Path, target: Path) -> Path:
    """An end-to-end model forced to nonsense: scores times 20, x1 and x2 swapped -> ``(1, 300, 6)``."""
    nodes = [
        helper.make_node("Gather", ["sane", "order"], ["swapped"], axis=2),
        helper.make_node("Mul", ["swapped", "gain"], ["output0"]),
    ]
    inits = [
        _const("order", np.array([2, 1, 0, 3, 4, 5], np.int64)),
        _const("gain", np.array([1, 1, 1, 1, 20, 1], np.float32)),
    ]
    return rewrite(source, target, nodes, inits, [1, K, 6], raw="sane")


def constant_outputs_model(
    outputs: dict[str, np.ndarray], path: Path, size: int = 64, metadata: dict | None = None
) -> Path:
    """A model with one image input ``(1, 3, size, size)`` whose outputs are the given constants
    (the input is consumed: added times zero), for decoders with known answers."""
    nodes = [
        helper.make_node("ReduceSum", ["images"], ["total"], keepdims=0),
        helper.make_node("Mul", ["total", "zero"], ["nothing"]),
    ]
    inits = [_const("zero", np.zeros((1,), np.float32))]
    outs = []
    for name, value in outputs.items():
        inits.append(_const(f"{name}_value", value.astype(np.float32)))
        nodes.append(helper.make_node("Add", [f"{name}_value", "nothing"], [name]))
        outs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape)))
    return _save(nodes, inits, outs, path, size, metadata)


def _save(nodes: list, inits: list, outs: list, path: Path, size: int, metadata: dict | None) -> Path:
    """A checked opset-17 model of `nodes` on an ``images (1, 3, size, size)`` input, saved to `path`."""
    image = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, size, size])
    graph = helper.make_graph(nodes, path.stem, [image], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    for key, value in (metadata or {}).items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def brightness_model(rows_when_grey: np.ndarray, path: Path, size: int = 64, metadata: dict | None = None) -> Path:
    """One output that is zero on a blank black frame and `rows_when_grey` on a grey one (pixels
    114): ``mean(input) * rows_when_grey / (114/255)``, input ``(1, 3, size, size)``."""
    grey = 114 / 255
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["mean"], keepdims=0),
        helper.make_node("Mul", ["mean", "rows"], ["output0"]),
    ]
    inits = [_const("rows", (rows_when_grey / grey).astype(np.float32))]
    out = helper.make_tensor_value_info("output0", TensorProto.FLOAT, list(rows_when_grey.shape))
    return _save(nodes, inits, [out], path, size, metadata)


def backbone_model(path: Path, repeats: int = 0) -> Path:
    """Write an ONNX detector shaped like a small YOLO backbone at 640x640 to `path`: nine 3x3
    convolutions with SiLU, strides down to 20x20, random weights; `repeats` more 3x3 64-channel
    convolutions at 80x80 follow the fifth, sharing its weight (about 0.24 GMAC each, so the
    model's cost grows, not its file, nor the weights ONNX Runtime prepacks per node). It decodes
    as YOLOv8 with 4 classes (output ``(1, 8, 400)``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    layers = [(3, 16, 2), (16, 32, 2), (32, 32, 1), (32, 64, 2), (64, 64, 1), (64, 128, 2), (128, 128, 1)]
    layers += [(128, 256, 2), (256, 256, 1)]
    nodes, initializers, previous = [], [], "images"

    def conv_silu(name: str, weights: str, stride: int) -> None:
        nonlocal previous
        nodes.extend(
            [
                helper.make_node(
                    "Conv", [previous, weights], [f"c{name}"], pads=[1, 1, 1, 1], strides=[stride, stride]
                ),
                helper.make_node("Sigmoid", [f"c{name}"], [f"s{name}"]),
                helper.make_node("Mul", [f"c{name}", f"s{name}"], [f"a{name}"]),
            ]
        )
        previous = f"a{name}"

    for i, (cin, cout, stride) in enumerate(layers):
        weights = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(cin * 9)).astype(np.float32)
        initializers.append(numpy_helper.from_array(weights, f"w{i}"))
        conv_silu(str(i), f"w{i}", stride)
        for r in range(repeats if i == 4 else 0):  # (64, 64, 1) at 80x80
            conv_silu(f"r{r}", "w4", 1)
    initializers += [
        numpy_helper.from_array((rng.standard_normal((8, 256, 1, 1)) * 0.1).astype(np.float32), "head"),
        numpy_helper.from_array(np.array([1, 8, -1], np.int64), "shape"),
    ]
    nodes += [
        helper.make_node("Conv", [previous, "head"], ["h"]),
        helper.make_node("Reshape", ["h", "shape"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "backbone",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 640, 640])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 8, 400])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def two_overlapping_boxes(constant_model) -> Path:  # type: ignore[no-untyped-def]
    """A YOLOv8-layout model (1, 4 + 1, 8) on a 64x64 input: two boxes 20 px wide, 4 px apart
    (IoU 2/3), scores 0.9 and 0.8; six more anchors score 0."""
    rows = np.zeros((1, 5, 8), np.float32)
    rows[0, :, 0] = [32.0, 32.0, 20.0, 20.0, 0.9]
    rows[0, :, 1] = [36.0, 32.0, 20.0, 20.0, 0.8]
    rows[0, :4, 2:] = [[10.0], [10.0], [4.0], [4.0]]
    return constant_model(rows, metadata={"names": "{0: 'thing'}"})  # type: ignore[no-any-return]


def yolov8_layout(model: Path) -> tuple[int, float]:
    """``(4 + nc, width)`` of the YOLOv8-layout detector `model`: its output's rows, and the width
    of its input in the units of its boxes (the input width when the boxes are in input pixels, as
    the COCO exports give them; 1.0 when normalised, as the demo detector does). Read from what it
    gives on a real frame (the synthetic scene's first, letterboxed as a device does): the anchors'
    ``cx`` span the whole input, so their largest is near the width, or near 1."""
    from pipelines.decoding.detector import Detector
    from pipelines.sources.synthetic import SyntheticScene
    from runtimes.registry import load_runtime

    with load_runtime("onnxruntime", model) as runtime:
        detector = Detector(runtime, "yolov8")
        tensor, _ = detector.prepare(SyntheticScene(seed=0).render(0)[0])
        (output,) = runtime.infer([tensor])
        width = detector.input_hw[1]
    return int(output.shape[1]), float(width) if float(np.max(output[0, 0])) > 2.0 else 1.0


def altered(
    source: Path,
    target: Path,
    *,
    swap: tuple[int, int] | None = None,
    score_scale: float = 1.0,
    shift: float = 0.0,
) -> Path:
    """A wrong version of the YOLOv8-layout detector `source` (output ``(1, 4 + nc, N)``: ``cx, cy,
    w, h``, then nc class scores) that today's checks cannot tell from a good one: its bundle's
    reference outputs come from itself, and it runs as fast. Nodes appended after ``output0``:

    - `swap` ``(a, b)``: the score channels of classes a and b exchanged (a ``Gather`` on axis 1
      with a permutation): a retrain whose label order slipped;
    - `score_scale`: every class score multiplied by it (0.2: an export whose recall collapsed);
    - `shift`: every box moved right by that fraction of the input width (``cx`` plus `shift`
      times the width in the output's units, which `yolov8_layout` reads: pixels or normalised).

    The metadata (names, imgsz, stride, ...) is kept, so ``edge-agent detect`` and ``bundle build``
    read the altered model as they read the source."""
    rows, width = yolov8_layout(source)
    nc = rows - 4
    order = np.arange(rows, dtype=np.int64)
    if swap is not None:
        a, b = swap
        if not (0 <= a < nc and 0 <= b < nc and a != b):
            raise ValueError(f"swap: expected two different class ids below {nc}, got {swap}")
        order[4 + a], order[4 + b] = 4 + b, 4 + a
    gain = np.ones((1, rows, 1), np.float32)
    gain[0, 4:, 0] = score_scale
    offset = np.zeros((1, rows, 1), np.float32)
    offset[0, 0, 0] = shift * width
    nodes = [
        helper.make_node("Gather", ["altered_raw", "altered_order"], ["altered_swapped"], axis=1),
        helper.make_node("Mul", ["altered_swapped", "altered_gain"], ["altered_scaled"]),
        helper.make_node("Add", ["altered_scaled", "altered_offset"], ["output0"]),
    ]
    inits = [_const("altered_order", order), _const("altered_gain", gain), _const("altered_offset", offset)]
    (output,) = onnx.load(str(source), load_external_data=False).graph.output
    shape = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in output.type.tensor_type.shape.dim]
    return rewrite(source, target, nodes, inits, shape, raw="altered_raw")
