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
- ``demo_<task>_int8.tflite`` for the tasks in `INT8_TASKS` (none yet: see there): full-integer
  INT8 (PT2E static quantization calibrated on synthetic frames disjoint from training and tests);
- ``demo_classify.onnx``, ``demo_classify_fp32.tflite``, ``demo_classify_int8.tflite``: the
  crop classifier, ``(1, 3)`` softmax.

    python scripts/export_task_models.py --weights build/task --out agent/demo

Needs the ``train`` extra (PyTorch, onnx, onnxslim, onnxscript, litert-torch).
"""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from demo_model import STRIDES
from export_demo_model import CALIBRATION_SEED, OPSET, calibration_frames
from task_models import NUM_KEYPOINTS, CropClassifier, ExportTaskModel, TaskModel
from train_task_models import crop_input

from agent.optimise.hygiene import check_loaded, check_model
from agent.optimise.variants import set_metadata
from pipelines.sources.synthetic import SyntheticScene

REPO = Path(__file__).resolve().parent.parent
TASKS = ("segment", "pose", "obb")
#: detection tasks with an INT8 export: none yet. litert-torch refuses the pose model's quantized
#: concatenation of its levels ("quantization parameters violate the same scale constraint"), and
#: the segment and obb graphs it quantizes give every cell the same score (0.497 on a blank frame)
INT8_TASKS: tuple[str, ...] = ()


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
    """Ultralytics' convention: a zip with metadata.json appended to the .tflite file."""
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("metadata.json", json.dumps({**meta, "names": {str(k): v for k, v in meta["names"].items()}}))


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


def export_int8(module: torch.nn.Module, size: int, path: Path, meta: dict[str, Any], frames: list[np.ndarray]) -> None:
    """Full-integer INT8 (PT2E static quantization on representative NHWC `frames`)."""
    import litert_torch
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    sample = (torch.zeros(1, size, size, 3),)
    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
    graph = prepare_pt2e(torch.export.export(module.eval(), sample).module(), quantizer)
    with torch.no_grad():
        for frame in frames:
            graph(torch.from_numpy(frame).permute(0, 2, 3, 1).contiguous())
    graph = convert_pt2e(graph, fold_quantize=False)
    litert_torch.convert(graph, sample, quant_config=QuantConfig(pt2e_quantizer=quantizer)).export(str(path))
    _append_metadata(path, meta)


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
    parser.add_argument(
        "--weights", type=Path, required=True, help="folder with segment.pt, pose.pt, obb.pt, classify.pt"
    )
    parser.add_argument("--out", type=Path, default=REPO / "agent" / "demo")
    parser.add_argument("--tasks", nargs="+", default=[*TASKS, "classify"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
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
                export_int8(tflite, size, Path(f"{stem}_int8.tflite"), meta, frames)
    for path in sorted(args.out.glob("demo_*")):
        print(f"{path.name:<36} {path.stat().st_size:>9} bytes")


if __name__ == "__main__":
    main()
