#!/usr/bin/env python3
"""Export the trained demo detector to the artifacts the agent ships (agent/demo/):

- ``demo_detector.onnx``: FP32, opset 17, constant folding, dynamic batch axis, checked with
  ``onnx.checker`` and shape inference, simplified with onnxslim, Ultralytics-style metadata
  (``names``, ``imgsz``, ``stride``) so decoders and labels are found automatically;
- ``demo_detector_dynamic.onnx``: the same with dynamic height and width, for rect inference;
- ``demo_detector_int8_qdq.onnx``: INT8 Q/DQ (symmetric, per-channel weights) from ONNX Runtime
  static quantization, calibrated on synthetic frames (seeds disjoint from training and tests),
  by the same library code as ``bundle build --precisions int8`` (``agent.optimise``);
- ``demo_detector_fp32.tflite`` and ``demo_detector_int8.tflite``: LiteRT, converted from
  PyTorch by litert-torch; the INT8 one is full-integer (PT2E static quantization calibrated on
  the same representative frames).

    python scripts/export_demo_model.py --weights build/demo/demo_detector.pt --out agent/demo

Needs the ``train`` extra (PyTorch, onnx, onnxslim, onnxscript, litert-torch).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import torch
from demo_model import STRIDES, DemoDetector, ExportModel

from agent.optimise.hygiene import check_loaded, check_model
from agent.optimise.variants import quantize_qdq, set_metadata
from pipelines.decoding.preprocess import PreprocessConfig, preprocess
from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene

REPO = Path(__file__).resolve().parent.parent

CALIBRATION_SEED = 200_000
OPSET = 17


def load(weights: Path) -> tuple[DemoDetector, int]:
    checkpoint = torch.load(weights, map_location="cpu", weights_only=True)
    model = DemoDetector(num_classes=len(checkpoint["names"]))
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval(), int(checkpoint["input_size"])


def calibration_frames(size: int, count: int = 64) -> list[np.ndarray]:
    """Representative inputs ``(1, 3, size, size)`` float32 from synthetic scenes."""
    config = PreprocessConfig(size=(size, size))
    frames = []
    for i in range(count):
        scene = SyntheticScene(seed=CALIBRATION_SEED + i // 8, num_shapes=3 + i % 5)
        frames.append(preprocess(scene.render(i * 11)[0], config)[0])
    return frames


def metadata(size: int) -> dict[str, str]:
    return {
        "names": repr(dict(enumerate(CLASS_NAMES))),
        "imgsz": json.dumps([size, size]),
        "stride": str(max(STRIDES)),
        "task": "detect",
        "description": "edge-agent demo detector: circles, squares and triangles of the synthetic scene",
        "author": "edge-agent",
        "license": "Apache-2.0",
    }


def export_onnx(model: DemoDetector, size: int, path: Path, dynamic_hw: bool = False) -> None:
    """Fixed `size` x `size` input with a dynamic batch axis; with `dynamic_hw` also dynamic
    height and width (the cell grid is then computed in the graph), for rect inference."""
    sample = torch.zeros(1, 3, size, size)
    axes = {"images": {0: "batch"}, "output0": {0: "batch"}}
    if dynamic_hw:
        axes = {"images": {0: "batch", 2: "height", 3: "width"}, "output0": {0: "batch", 2: "anchors"}}
    torch.onnx.export(
        model if dynamic_hw else ExportModel(model, size).eval(),
        (sample,),
        str(path),
        opset_version=OPSET,
        do_constant_folding=True,
        input_names=["images"],
        output_names=["output0"],
        dynamic_axes=axes,
        dynamo=False,
    )
    import onnxslim

    graph = check_model(path)  # onnx.checker (full) and strict shape inference, as bundle build does
    graph = onnxslim.slim(graph)
    set_metadata(graph, metadata(size))
    check_loaded(graph, path.name)
    onnx.save(graph, str(path))


def export_qdq(fp32: Path, path: Path, frames: list[np.ndarray]) -> None:
    """The library's INT8 Q/DQ quantization (what `bundle build --precisions int8` runs)."""
    quantize_qdq(fp32, path, "images", frames, method="minmax", activations="symmetric")


def _append_metadata(path: Path, size: int) -> None:
    """Ultralytics' convention: a zip with metadata.json appended to the .tflite file."""
    import zipfile

    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive:
        meta = {"names": dict(enumerate(CLASS_NAMES)), "imgsz": [size, size], "stride": max(STRIDES), "task": "detect"}
        archive.writestr("metadata.json", json.dumps(meta))


def export_tflite(model: DemoDetector, size: int, out: Path, frames: list[np.ndarray]) -> None:
    import litert_torch

    nhwc = ExportModel(model, size, nhwc=True).eval()
    sample = (torch.zeros(1, size, size, 3),)
    litert_torch.convert(nhwc, sample).export(str(out / "demo_detector_fp32.tflite"))
    _append_metadata(out / "demo_detector_fp32.tflite", size)

    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
    graph = torch.export.export(nhwc, sample).module()
    graph = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for frame in frames:
            graph(torch.from_numpy(frame).permute(0, 2, 3, 1).contiguous())
    graph = convert_pt2e(graph, fold_quantize=False)
    int8 = litert_torch.convert(graph, sample, quant_config=QuantConfig(pt2e_quantizer=quantizer))
    int8.export(str(out / "demo_detector_int8.tflite"))
    _append_metadata(out / "demo_detector_int8.tflite", size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=REPO / "agent" / "demo")
    parser.add_argument("--skip-tflite", action="store_true", help="only the ONNX artifacts")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model, size = load(args.weights)
    frames = calibration_frames(size)
    export_onnx(model, size, args.out / "demo_detector.onnx")
    export_onnx(model, size, args.out / "demo_detector_dynamic.onnx", dynamic_hw=True)
    export_qdq(args.out / "demo_detector.onnx", args.out / "demo_detector_int8_qdq.onnx", frames)
    if not args.skip_tflite:
        export_tflite(model, size, args.out, frames)
    (args.out / "labels.txt").write_text("\n".join(CLASS_NAMES) + "\n")
    for path in sorted(args.out.iterdir()):
        print(f"{path.name:<32} {path.stat().st_size:>9} bytes")


if __name__ == "__main__":
    main()
