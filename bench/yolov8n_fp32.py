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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=REPO.parent / "shared" / "models" / "yolov8n_int8_640.onnx")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "bench" / "yolov8n_640.onnx")
    args = parser.parse_args()
    model = onnx.load(str(args.source))
    count = dequantize_convolutions(model)
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


if __name__ == "__main__":
    main()
