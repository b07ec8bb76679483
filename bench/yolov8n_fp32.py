#!/usr/bin/env python3
"""Make an FP32 YOLOv8n ONNX model from ../shared/models/yolov8n_int8_640.onnx, for benchmarks.

That file is YOLOv8n (COCO weights) after ONNX Runtime's dynamic quantization: each convolution
became DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul(scales) -> Add(bias). This script
turns each back into one float ``Conv`` with the dequantized weights and the bias, and drops
what no longer feeds anything, so the result has the YOLOv8n architecture Ultralytics exports
(with weights rounded to 8 bits once). It writes into build/ (never into the repository: the
weights' licence is unknown, ../shared/models/README.md), and checks the result against the
quantized model on one frame. The pipeline benchmark (docs/benchmarks.md) uses it where no
Ultralytics environment exists to export random-weight YOLOv8n models.

    python bench/yolov8n_fp32.py [--source SHARED/yolov8n_int8_640.onnx] [--out build/bench/yolov8n_640.onnx]
        [--dynamic]

``--dynamic`` makes a dynamic height/width export instead (as Ultralytics' ``dynamic=True``, the
batch left at 1): the head's anchor and stride tables, constants for 640x640, are computed from
the three feature maps' shapes, and the DFL's reshapes take any number of anchors. Checked
against the fixed model at 640x640 (equal) and run at 384x640 (5,040 anchors).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

REPO = Path(__file__).resolve().parent.parent


def _consumers(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    return [n for n in graph.node if name in n.input]


def dequantize_convolutions(model: onnx.ModelProto) -> int:
    """Replace every ConvInteger chain by a float Conv; returns how many were replaced."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    replaced, new_inits = 0, []
    for node in [n for n in graph.node if n.op_type == "ConvInteger"]:
        x_q, w_q, _, w_zp = node.input
        x = producer[x_q].input[0]  # DynamicQuantizeLinear's float input
        weight = w_q.removesuffix("_quantized")
        w = numpy_helper.to_array(inits[w_q]).astype(np.int32) - numpy_helper.to_array(inits[w_zp]).astype(np.int32)
        w = (w * numpy_helper.to_array(inits[f"{weight}_scale"])).astype(np.float32)
        cast = _consumers(graph, node.output[0])[0]
        mul = _consumers(graph, cast.output[0])[0]
        chain, inputs, output = [node, cast, mul], [x, f"{weight}_fp32"], mul.output[0]
        after = _consumers(graph, mul.output[0])
        reshape = producer.get(after[0].input[1]) if after and after[0].op_type == "Add" else None
        if reshape is not None and reshape.op_type == "Reshape" and reshape.input[0] in inits:
            chain.append(after[0])  # the bias Add: its Reshape(bias) becomes the Conv's bias input
            inputs.append(reshape.input[0])
            output = after[0].output[0]
        new_inits.append(numpy_helper.from_array(w, f"{weight}_fp32"))
        conv = helper.make_node("Conv", inputs, [output], name=node.name.removesuffix("_quant"))
        conv.attribute.extend(node.attribute)
        index = list(graph.node).index(node)
        for old in chain:
            graph.node.remove(old)
        graph.node.insert(index, conv)
        replaced += 1
    graph.initializer.extend(new_inits)
    return replaced


def prune(model: onnx.ModelProto) -> None:
    """Drop nodes whose outputs nothing uses, then initializers nothing uses."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    while True:
        used = {i for n in graph.node for i in n.input} | outputs
        dead = [n for n in graph.node if not any(o in used for o in n.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    used = {i for n in graph.node for i in n.input}
    for init in [i for i in graph.initializer if i.name not in used]:
        graph.initializer.remove(init)


def _node(graph: onnx.GraphProto, op: str, inputs: list[str], name: str, **attrs: object) -> str:
    graph.node.append(helper.make_node(op, inputs, [name], name=name, **attrs))
    return name


def _const(graph: onnx.GraphProto, name: str, value: object, dtype: type = np.int64) -> str:
    graph.initializer.append(numpy_helper.from_array(np.array(value, dtype), name))
    return name


def dynamic_hw(model: onnx.ModelProto) -> None:
    """Make the input's height and width dynamic: the anchor points (x, y of each cell's centre,
    stride by stride, row-major) and the per-anchor strides come from the feature maps' shapes."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    nodes = {n.name: n for n in graph.node}
    for name, shape in (("/model.22/dfl/Reshape", [1, 4, 16, -1]), ("/model.22/dfl/Reshape_1", [1, 4, -1])):
        nodes[name].input[1] = _const(graph, f"{name}/dynamic_shape", shape)
    xy_rows, stride_rows = [], []
    for level, stride in enumerate((8, 16, 32)):
        p = f"/dynamic/anchors{level}"
        fmap = f"/model.22/cv2.{level}/cv2.{level}.2/Conv_output_0"  # (1, 64, h, w)
        shape = _node(graph, "Shape", [fmap], f"{p}/shape")
        centres = []
        for axis, dim in ((2, "h"), (3, "w")):
            size = _node(graph, "Gather", [shape, _const(graph, f"{p}/{dim}_axis", axis)], f"{p}/{dim}")
            zero, one = _const(graph, f"{p}/{dim}_0", 0), _const(graph, f"{p}/{dim}_1", 1)
            steps = _node(graph, "Range", [zero, size, one], f"{p}/{dim}_range")
            cast = _node(graph, "Cast", [steps], f"{p}/{dim}_float", to=onnx.TensorProto.FLOAT)
            centres.append(
                _node(graph, "Add", [cast, _const(graph, f"{p}/{dim}_half", 0.5, np.float32)], f"{p}/{dim}_c")
            )
        hw = _node(graph, "Slice", [shape, _const(graph, f"{p}/from", [2]), _const(graph, f"{p}/to", [4])], f"{p}/hw")
        column, row = _const(graph, f"{p}/column", [-1, 1]), _const(graph, f"{p}/row", [1, -1])
        ys = _node(graph, "Expand", [_node(graph, "Reshape", [centres[0], column], f"{p}/ys_col"), hw], f"{p}/ys")
        xs = _node(graph, "Expand", [_node(graph, "Reshape", [centres[1], row], f"{p}/xs_row"), hw], f"{p}/xs")
        flat_x = _node(graph, "Reshape", [xs, row], f"{p}/x_flat")
        flat_y = _node(graph, "Reshape", [ys, row], f"{p}/y_flat")
        xy_rows.append(_node(graph, "Concat", [flat_x, flat_y], f"{p}/xy", axis=0))
        zeros = _node(graph, "Mul", [flat_x, _const(graph, f"{p}/zero", 0.0, np.float32)], f"{p}/zeros")
        stride_rows.append(_node(graph, "Add", [zeros, _const(graph, f"{p}/stride", stride, np.float32)], f"{p}/s"))
    points = _node(graph, "Concat", xy_rows, "/dynamic/points", axis=1)  # (2, N)
    anchors = _node(graph, "Reshape", [points, _const(graph, "/dynamic/shape", [1, 2, -1])], "/dynamic/anchors")
    strides = _node(graph, "Concat", stride_rows, "/dynamic/strides", axis=1)  # (1, N)
    fixed = {
        "/model.22/Constant_12_output_0": anchors,
        "/model.22/Constant_13_output_0": anchors,
        "/model.22/Constant_15_output_0": strides,
    }
    for node in graph.node:
        node.input[:] = [fixed.get(i, i) for i in node.input]
    for name in fixed:
        graph.initializer.remove(inits[name])
    dims = graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"
    graph.output[0].type.tensor_type.shape.dim[2].dim_param = "anchors"
    del graph.value_info[:]  # shapes inferred for 640x640
    topological_sort(graph)


def topological_sort(graph: onnx.GraphProto) -> None:
    """Order the nodes so that each comes after the producers of its inputs (as ONNX requires)."""
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        now = [n for n in pending if all(i in ready for i in n.input)]
        if not now:
            raise ValueError(f"a cycle or a missing input among {[n.name for n in pending][:5]}")
        ordered += now
        ready |= {o for n in now for o in n.output}
        pending = [n for n in pending if n not in now]
    del graph.node[:]
    graph.node.extend(ordered)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=REPO.parent / "shared" / "models" / "yolov8n_int8_640.onnx")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "bench" / "yolov8n_640.onnx")
    parser.add_argument("--dynamic", action="store_true", help="dynamic height and width (see above)")
    args = parser.parse_args()
    model = onnx.load(str(args.source))
    count = dequantize_convolutions(model)
    if args.dynamic:
        dynamic_hw(model)
    prune(model)
    onnx.checker.check_model(model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(args.out))

    import onnxruntime

    frame = np.random.default_rng(0).random((1, 3, 640, 640), dtype=np.float32)
    run = [onnxruntime.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (args.source, args.out)]
    quantized, fp32 = (session.run(None, {"images": frame})[0] for session in run)
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"{args.out}: {count} convolutions dequantized, operators {ops}")
    print(f"max |fp32 - int8| on a random frame: boxes {np.abs(fp32[:, :4] - quantized[:, :4]).max():.2f} px, "
          f"scores {np.abs(fp32[:, 4:] - quantized[:, 4:]).max():.3f}")  # fmt: skip
    if args.dynamic:
        wide = run[1].run(None, {"images": frame[:, :, :384, :]})[0]
        print(f"dynamic: 384x640 gives {wide.shape}")


if __name__ == "__main__":
    main()
