#!/usr/bin/env python3
"""INT8 the OpenVINO way (NNCF post-training quantization) against FP32 and an ONNX Q/DQ
variant, all run by OpenVINO: per-call medians, interleaved rounds, and each INT8 model's
detection agreement with the FP32 model's on the calibration photos (docs/openvino.md).

Needs ``pip install nncf`` (not an extra of edge-agent: docs/openvino.md says why).

    python bench/openvino_int8.py MODEL.onnx --photos build/bench/photos [--qdq VARIANT.onnx] [--rounds 3]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import nncf
import numpy as np
import onnx
import openvino as ov

from pipelines.decoding.detector import Detector
from pipelines.measure.parity import detection_agreement
from runtimes.registry import load_runtime

#: left in float, as Ultralytics' own NNCF export does for YOLO heads
IGNORED = ["Multiply", "Subtract", "Sigmoid", "Softmax"]
IGNORED_ONNX = ["Mul", "Sub", "Sigmoid", "Softmax"]


def median_ms(compiled: Any, tensor: np.ndarray, calls: int) -> float:
    request = compiled.create_infer_request()
    for _ in range(3):
        request.infer({0: tensor})
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        request.infer({0: tensor})
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--qdq", type=Path, help="an ONNX Q/DQ variant to compare (bundle build --precisions int8)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    images = [cv2.imread(str(p)) for p in sorted(args.photos.glob("*.png"))]
    fp32 = Detector(load_runtime("openvino", args.model))
    prepared = [fp32.prepare(image) for image in images]
    truth = [fp32.detect(image) for image in images]
    tensors = [tensor for tensor, _ in prepared]
    core = ov.Core()
    settings = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    preset = nncf.QuantizationPreset.MIXED
    ir = nncf.quantize(core.read_model(str(args.model)), nncf.Dataset(tensors), subset_size=len(tensors),
                       preset=preset, ignored_scope=nncf.IgnoredScope(types=IGNORED))  # fmt: skip
    name = onnx.load(str(args.model)).graph.input[0].name
    as_onnx = nncf.quantize(onnx.load(str(args.model)), nncf.Dataset([{name: t} for t in tensors]),
                            subset_size=len(tensors), preset=preset,
                            ignored_scope=nncf.IgnoredScope(types=IGNORED_ONNX))  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="openvino-int8-"))
    ov.save_model(ir, str(folder / "nncf.xml"))
    onnx.save(as_onnx, str(folder / "nncf_qdq.onnx"))
    models: dict[str, Any] = {
        "fp32": args.model,
        "nncf-ir": folder / "nncf.xml",
        "nncf-qdq-onnx": folder / "nncf_qdq.onnx",
    }
    if args.qdq:
        models["qdq"] = args.qdq
    compiled = {label: core.compile_model(str(path), "CPU", settings) for label, path in models.items()}
    for label, model in compiled.items():
        found = 0.0
        for (tensor, transform), want in zip(prepared, truth, strict=True):
            request = model.create_infer_request()
            request.infer({0: tensor})
            got = fp32.postprocess([np.array(request.get_output_tensor(0).data)], transform)
            found += detection_agreement(got, want)
        print(f"{label}: agreement with fp32 {found / len(images):.2f} over {len(images)} photos "
              f"({sum(len(t) for t in truth)} fp32 detections)")  # fmt: skip
    rounds: dict[str, list[float]] = {label: [] for label in compiled}
    for _ in range(args.rounds):
        for label, model in compiled.items():
            rounds[label].append(median_ms(model, tensors[0], args.calls))
    base = float(np.median(rounds["fp32"]))
    for label, values in rounds.items():
        ms = float(np.median(values))
        print(f"{label}: {ms:.2f} ms median of {args.rounds} rounds {[round(v, 2) for v in values]}, "
              f"{base / ms:.2f}x fp32")  # fmt: skip


if __name__ == "__main__":
    main()
