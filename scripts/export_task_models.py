#!/usr/bin/env python3
"""Export the trained task models (scripts/train_task_models.py) to the demo artifacts the agent
ships (agent/demo/), in Ultralytics' (8.4) export layouts and metadata:

- ``demo_<task>.onnx`` (segment, pose, obb): FP32, opset 17, pixel coordinates; segment has a
  second output, the prototypes ``(1, 32, H/4, W/4)``;
- ``demo_<task>_e2e.onnx``: the end-to-end form, the best 300 rows by the one-to-one head
  (``end2end`` in the metadata, as YOLO26 exports);
- ``demo_<task>_fp32.tflite`` and ``demo_<task>_e2e_fp32.tflite``: LiteRT through litert-torch,
  ``(1, H, W, 3)`` input, coordinates normalised to 0..1 of the input and prototypes
  channel-last ``(1, H/4, W/4, 32)``, as Ultralytics' channel-last TFLite exports;
- ``demo_<task>_int8.tflite`` (segment, pose, obb): INT8 with the head in float (`export_int8`
  with `HEAD_IN_FLOAT`): every convolution of the backbone, pyramid and head stems int8 (PT2E
  static quantization calibrated on synthetic frames disjoint from training and tests), the
  first convolution, the final prediction convolutions, the decode and the outputs float; float
  input and outputs, so no output shares one range across boxes, scores, coefficients and angle,
  and no reader's rounding of a quantized input matters;
- ``demo_classify.onnx``, ``demo_classify_fp32.tflite``, ``demo_classify_int8.tflite``: the
  crop classifier, ``(1, 3)`` softmax.

    python scripts/export_task_models.py --weights build/task --out agent/demo

The trained checkpoints live in an ignored build folder; `--from-onnx agent/demo` recovers the
networks from the shipped FP32 ONNX files instead (`recover`: the fused convolutions' weights, the
BatchNorms made identities), checks them against those files and writes only the INT8 files, so
the FP32 artifacts stay as they are:

    python scripts/export_task_models.py --from-onnx agent/demo --tasks segment pose obb

Needs the ``train`` extra (PyTorch, onnx, onnxslim, onnxscript, litert-torch).
"""

from __future__ import annotations

import argparse
import ast
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from demo_model import STRIDES
from export_demo_model import CALIBRATION_SEED, OPSET, calibration_frames
from onnx import numpy_helper
from task_models import NUM_KEYPOINTS, CropClassifier, ExportTaskModel, TaskModel
from train_task_models import crop_input

from agent.optimise.hygiene import check_loaded, check_model
from agent.optimise.variants import set_metadata
from pipelines.sources.synthetic import SyntheticScene

REPO = Path(__file__).resolve().parent.parent
TASKS = ("segment", "pose", "obb")
#: detection tasks with an INT8 TFLite export. Quantized whole, litert-torch refused the pose
#: model's quantized concatenation of its levels ("quantization parameters violate the same scale
#: constraint") and the segment and obb graphs gave every cell the same score (0.497 on a blank
#: frame); with the head in float (`HEAD_IN_FLOAT`) all three convert and decode
INT8_TASKS: tuple[str, ...] = TASKS
#: `TaskModel` submodules left in float in the detection tasks' INT8 exports: the first convolution
#: (so the input stays float: Ultralytics truncates a quantized input where the agent rounds), the
#: three heads (a 3x3 convolution and the prediction convolution of box sides, scores,
#: coefficients, keypoints, angle) and the prototypes' last convolution. Everything outside
#: `TaskModel` (the decode, the concatenation, the outputs) is float too. With only the
#: prediction convolutions in float, keypoints lay 0.66 px (median; 4.5 px at the 90th
#: percentile) from FP32's and corners 0.54 px (6.0 px), against 0.30 (1.3) and 0.34 (0.8) with
#: the heads in float, for 200 KB more a file
HEAD_IN_FLOAT = ("stem.0", "heads", "proto.3")


def recover(path: Path) -> tuple[TaskModel, dict[str, Any]]:
    """The `TaskModel` inside an FP32 ONNX export of this script, and a checkpoint-like dict
    (``names``, ``task``, ``input_size``, no ``state_dict``). torch.onnx.export fused each
    BatchNorm into its convolution and kept the module path in the node name
    (``/stem/stem.0/stem.0.0/Conv``): each convolution takes its fused weight and bias, and the
    BatchNorm after it becomes an identity plus that bias. Raises ``ValueError`` when a
    convolution of the module has no node or a shape differs (another network)."""
    graph = onnx.load(str(path))
    meta = {p.key: p.value for p in graph.metadata_props}
    names = ast.literal_eval(meta["names"])
    task = meta["task"]
    if task not in TASKS:
        raise ValueError(f"{path.name}: task {task!r}, expected one of {TASKS}")
    model = TaskModel(task, len(names)).eval()
    weights = {i.name: numpy_helper.to_array(i) for i in graph.graph.initializer}
    modules = dict(model.named_modules())
    filled = set()
    with torch.no_grad():
        for node in graph.graph.node:
            if node.op_type != "Conv":
                continue
            name = node.name.split("/")[-2]
            conv = modules.get(name)
            weight, bias = (torch.from_numpy(weights[n].copy()) for n in node.input[1:3])
            if not isinstance(conv, torch.nn.Conv2d) or conv.weight.shape != weight.shape:
                raise ValueError(f"{path.name}: node {node.name} {tuple(weight.shape)} fits no convolution here")
            conv.weight.copy_(weight)
            if conv.bias is not None:
                conv.bias.copy_(bias)
            else:
                parent, index = name.rsplit(".", 1)
                norm = modules[parent][int(index) + 1]
                assert isinstance(norm, torch.nn.BatchNorm2d)
                norm.weight.fill_(1.0)
                norm.bias.copy_(bias)
                norm.running_mean.zero_()
                norm.running_var.fill_(1.0 - norm.eps)
            filled.add(name)
    missing = {n for n, m in modules.items() if isinstance(m, torch.nn.Conv2d)} - filled
    if missing:
        raise ValueError(f"{path.name}: no weights for {sorted(missing)}")
    size = int(ast.literal_eval(meta["imgsz"])[0])
    return model, {"names": [names[i] for i in sorted(names)], "task": task, "input_size": size}


def check_recovered(model: TaskModel, size: int, path: Path, seed: int = 0) -> float:
    """Largest absolute difference of `model`'s export form from the ONNX file at `path` on a
    seeded random input; raises ``ValueError`` above 1e-3 (the file's outputs reach a few hundred)."""
    import onnxruntime

    x = np.random.default_rng(seed).random((1, 3, size, size), dtype=np.float32)
    expected = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"images": x})
    with torch.no_grad():
        got = ExportTaskModel(model, size)(torch.from_numpy(x))
    outputs = got if isinstance(got, tuple) else (got,)
    worst = max(float(np.abs(o.numpy() - e).max()) for o, e in zip(outputs, expected, strict=True))
    if worst > 1e-3:
        raise ValueError(f"the network recovered from {path.name} differs from it by {worst:.3g}")
    return worst


def load(path: Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    names = checkpoint["names"]
    task = checkpoint["task"]
    model: torch.nn.Module = CropClassifier(len(names)) if task == "classify" else TaskModel(task, len(names))
    model.load_state_dict(checkpoint["state_dict"])
    return model.eval(), checkpoint


def metadata(checkpoint: dict[str, Any], end2end: bool) -> dict[str, Any]:
    """Ultralytics' metadata keys, as Python values (ONNX stores them as text)."""
    size = int(checkpoint["input_size"])
    meta: dict[str, Any] = {
        "description": f"edge-agent demo {checkpoint['task']} model: the synthetic scene's shapes",
        "author": "edge-agent",
        "license": "Apache-2.0",
        "task": checkpoint["task"],
        "batch": 1,
        "imgsz": [size, size],
        "stride": max(STRIDES),
        "names": dict(enumerate(checkpoint["names"])),
    }
    if checkpoint["task"] == "pose":
        meta["kpt_shape"] = [NUM_KEYPOINTS, 3]
    if end2end:
        meta["end2end"] = True
    return meta


def export_onnx(module: torch.nn.Module, size: int, path: Path, meta: dict[str, Any], outputs: list[str]) -> None:
    torch.onnx.export(
        module.eval(),
        (torch.zeros(1, 3, size, size),),
        str(path),
        opset_version=OPSET,
        do_constant_folding=True,
        input_names=["images"],
        output_names=outputs,
        dynamo=False,
    )
    import onnxslim

    graph = onnxslim.slim(check_model(path))
    set_metadata(graph, {k: v if isinstance(v, str) else repr(v) for k, v in meta.items()})
    check_loaded(graph, path.name)
    onnx.save(graph, str(path))


def _append_metadata(path: Path, meta: dict[str, Any]) -> None:
    """Ultralytics' convention: a zip with metadata.json appended to the .tflite file (dated
    1980-01-01, so an export made again is the same file byte for byte)."""
    entry = zipfile.ZipInfo("metadata.json", date_time=(1980, 1, 1, 0, 0, 0))
    entry.compress_type = zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(entry, json.dumps({**meta, "names": {str(k): v for k, v in meta["names"].items()}}))


class ChannelLast(torch.nn.Module):
    """Outputs of a TFLite export: the prototypes (any 4-D output) channel-last."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> Any:
        out = self.module(x)
        if isinstance(out, tuple):
            return tuple(o.permute(0, 2, 3, 1) if o.ndim == 4 else o for o in out)
        return out


def export_tflite(module: torch.nn.Module, size: int, path: Path, meta: dict[str, Any]) -> None:
    import litert_torch

    litert_torch.convert(module.eval(), (torch.zeros(1, size, size, 3),)).export(str(path))
    _append_metadata(path, meta)


def in_quantized_network(node: torch.fx.Node) -> bool:
    """Whether an exported graph's `node` is quantized with the head in float: nodes of the
    `TaskModel` (``...model...`` in the module stack), less those of `HEAD_IN_FLOAT`; weights and
    biases (no stack) follow the operator that reads them."""
    if node.op == "get_attr":
        return True
    stack = node.meta.get("nn_module_stack", {})
    if not stack:
        return False
    parts = str(list(stack.values())[-1][0]).split(".")
    if "model" not in parts:
        return False  # ExportTaskModel's decode, ChannelLast's permutes
    inner = ".".join(parts[parts.index("model") + 1 :])
    return not any(inner == name or inner.startswith(name + ".") for name in HEAD_IN_FLOAT)


def export_int8(
    module: torch.nn.Module,
    size: int,
    path: Path,
    meta: dict[str, Any],
    frames: list[np.ndarray],
    head_in_float: bool = False,
) -> None:
    """INT8 by PT2E static quantization on representative NHWC `frames`: full-integer (int8 in
    and out), or with `head_in_float` only the nodes `in_quantized_network` (float in and out).

    litert-torch's own module-name filter does not match torch.export's module paths
    (``module.model.stem.0.0``), hence the quantizer's annotation with our filter."""
    import litert_torch
    from litert_torch.quantize.pt2e_quantizer import (
        PT2EQuantizer,
        get_symmetric_quantization_config,
        propagate_annotation,
    )
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    class HeadInFloat(PT2EQuantizer):  # type: ignore[misc]
        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            self._annotate_all_static_patterns(model, self.global_config, in_quantized_network)
            propagate_annotation(model)
            return model

    sample = (torch.zeros(1, size, size, 3),)
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False)
    quantizer = (HeadInFloat() if head_in_float else PT2EQuantizer()).set_global(config)
    graph = prepare_pt2e(torch.export.export(module.eval(), sample).module(), quantizer)
    with torch.no_grad():
        for frame in frames:
            graph(torch.from_numpy(frame).permute(0, 2, 3, 1).contiguous())
    graph = convert_pt2e(graph, fold_quantize=False)
    litert_torch.convert(graph, sample, quant_config=QuantConfig(pt2e_quantizer=quantizer)).export(str(path))
    _append_metadata(path, meta)


def export_task_int8(
    model: TaskModel, checkpoint: dict[str, Any], path: Path, frames: list[np.ndarray] | None = None
) -> None:
    """``demo_<task>_int8.tflite``: the TFLite form (NHWC, 0..1 coordinates), head in float."""
    size = int(checkpoint["input_size"])
    tflite = ChannelLast(ExportTaskModel(model, size, nhwc=True, normalised=True))
    calibration = calibration_frames(size) if frames is None else frames
    export_int8(tflite, size, path, metadata(checkpoint, end2end=False), calibration, head_in_float=True)


def crop_frames(size: int, count: int = 64) -> list[np.ndarray]:
    """Representative classifier inputs ``(1, 3, size, size)``: crops of shapes in calibration scenes."""
    frames: list[np.ndarray] = []
    seed = CALIBRATION_SEED
    while len(frames) < count:
        image, truth = SyntheticScene(seed=seed, num_shapes=4).render(seed % 97)
        frames += [crop_input(image, box, size)[None] for box in truth.detections.xyxy]
        seed += 1
    return frames[:count]


class NHWC(torch.nn.Module):
    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> Any:
        return self.module(x.permute(0, 3, 1, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--weights", type=Path, help="folder with segment.pt, pose.pt, obb.pt, classify.pt")
    source.add_argument(
        "--from-onnx",
        type=Path,
        help="folder with the shipped demo_<task>.onnx: recover the networks from them, write only the INT8 files",
    )
    parser.add_argument("--out", type=Path, default=REPO / "agent" / "demo")
    parser.add_argument("--tasks", nargs="+", default=[*TASKS, "classify"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_onnx is not None:
        torch.manual_seed(0)
        for task in args.tasks:
            if task not in INT8_TASKS:
                parser.error(f"--from-onnx makes the INT8 files of {INT8_TASKS}, not {task!r}")
            onnx_path = args.from_onnx / f"demo_{task}.onnx"
            recovered, checkpoint = recover(onnx_path)
            worst = check_recovered(recovered, checkpoint["input_size"], onnx_path)
            print(f"{task}: recovered from {onnx_path.name}, largest difference from it {worst:.3g}")
            export_task_int8(recovered, checkpoint, args.out / f"demo_{task}_int8.tflite")
        return
    for task in args.tasks:
        model, checkpoint = load(args.weights / f"{task}.pt")
        size = int(checkpoint["input_size"])
        stem = args.out / f"demo_{task}"
        if task == "classify":
            meta = metadata(checkpoint, end2end=False)
            export_onnx(model, size, stem.with_suffix(".onnx"), meta, ["output0"])
            assert isinstance(model, CropClassifier)
            export_tflite(NHWC(model), size, Path(f"{stem}_fp32.tflite"), meta)
            export_int8(NHWC(model), size, Path(f"{stem}_int8.tflite"), meta, crop_frames(size))
            continue
        assert isinstance(model, TaskModel)
        outputs = ["output0", "output1"] if task == "segment" else ["output0"]
        frames = calibration_frames(size)
        for end2end in (False, True):
            meta = metadata(checkpoint, end2end)
            tail = "_e2e" if end2end else ""
            export_onnx(ExportTaskModel(model, size, end2end=end2end), size, Path(f"{stem}{tail}.onnx"), meta, outputs)
            tflite = ChannelLast(ExportTaskModel(model, size, nhwc=True, normalised=True, end2end=end2end))
            export_tflite(tflite, size, Path(f"{stem}{tail}_fp32.tflite"), meta)
            if not end2end and task in INT8_TASKS:
                export_task_int8(model, checkpoint, Path(f"{stem}_int8.tflite"), frames)
    for path in sorted(args.out.glob("demo_*")):
        print(f"{path.name:<36} {path.stat().st_size:>9} bytes")


if __name__ == "__main__":
    main()
