#!/usr/bin/env python3
"""Benchmark: what the task models cost per frame beyond a box detector's decode.

Steps timed, each per frame, medians over ``--frames`` runs:

- ``detect``: a box detector's decode + class-aware NMS of ``(1, 84, 8400)`` (the baseline);
- ``seg-decode``: a 640 ``-seg`` output ``(1, 116, 8400)`` + prototypes ``(1, 32, 160, 160)``:
  decode + NMS (the masks stay coefficients);
- ``seg-masks``: the mask step: every kept detection's mask drawn as a 640x480 frame bitmap
  (``coefficients @ prototypes``, upsampled, cropped, letterbox removed), what ``--save-dir``
  and the page's live frame do;
- ``seg-outlines``: every kept mask's outline at most 32 points (what an object event carries);
- ``pose-decode``: ``(1, 56, 8400)`` (17 keypoints) decode + NMS;
- ``obb-decode``: ``(1, 20, 8400)`` (15 classes and an angle) decode, then ``obb-nms``: the
  rotated NMS by probabilistic IoU of its candidates.

The outputs are synthetic at 640 (Ultralytics' layouts: 20 objects of 30 overlapping
candidates each, the other cells below the threshold; prototypes and coefficients random
normal), since no 640 seg / pose / obb export is in ../shared/models; ``--demo`` adds the
same steps on the shipped demo task models' real outputs (320 input) on a synthetic frame.

Usage: python bench/tasks.py [--frames 200] [--demo] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from pipelines.decoding.decoders import decode_yolov8
from pipelines.decoding.detections import Detections
from pipelines.decoding.masks import SourceMapping
from pipelines.decoding.nms import class_aware_nms
from pipelines.decoding.rotated import rotated_nms_indices
from pipelines.decoding.task_decoders import decode_yolov8_obb, decode_yolov8_pose, decode_yolov8_seg

REPO = Path(__file__).resolve().parent.parent
CONF, IOU, MAX_DET = 0.25, 0.45, 300
#: a 640x480 frame letterboxed into 640x640: 80 rows of padding above and below
MAPPING = SourceMapping(1.0, 1.0, 0.0, 80.0, (480, 640))

Outputs = list[npt.NDArray[np.float32]]


def grid_output(rows_after_classes: int, nc: int, objects: int = 20, per_object: int = 30, seed: int = 0) -> Outputs:
    """``(1, 4+nc+extra, 8400)``: `objects` objects of `per_object` jittered candidates scoring
    0.3..0.95 in one class, every other cell below 0.2; the extra rows random normal."""
    rng = np.random.default_rng(seed)
    out = np.zeros((4 + nc + rows_after_classes, 8400), np.float32)
    out[:4] = rng.uniform(0, 640, (4, 8400))
    out[4 : 4 + nc] = rng.uniform(0, 0.2, (nc, 8400))
    out[4 + nc :] = rng.normal(0, 1, (rows_after_classes, 8400))
    cells = rng.choice(8400, objects * per_object, replace=False).reshape(objects, per_object)
    for obj in range(objects):
        cx, cy = rng.uniform(80, 560, 2)
        w, h = rng.uniform(30, 160, 2)
        out[:4, cells[obj]] = np.array([[cx], [cy], [w], [h]]) + rng.normal(0, 3, (4, per_object))
        out[4 + int(rng.integers(nc)), cells[obj]] = rng.uniform(0.3, 0.95, per_object)
    return [out[None]]


def seg_outputs() -> Outputs:
    protos = np.random.default_rng(1).normal(0, 1, (1, 32, 160, 160)).astype(np.float32)
    return [*grid_output(32, 80), protos]


def _median_ms(step: Callable[[], object], frames: int) -> float:
    step()  # warm caches and lazy imports
    times = []
    for _ in range(frames):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def _seg_kept(outputs: Outputs, input_hw: tuple[int, int], mapping: SourceMapping | None) -> Detections:
    kept = class_aware_nms(decode_yolov8_seg(outputs, input_hw, CONF), IOU, MAX_DET)
    assert kept.masks is not None
    masks = kept.masks if mapping is None else kept.masks.to_source(mapping)
    return Detections(kept.xyxy, kept.confidence, kept.class_id, masks=masks)


def measure(
    seg: Outputs,
    pose: Outputs,
    obb: Outputs,
    detect: Outputs,
    input_hw: tuple[int, int],
    mapping: SourceMapping | None,
    frames: int,
    kpt_shape: tuple[int, int] = (17, 3),
) -> dict[str, dict[str, float]]:
    """Median milliseconds per frame of each step, its ratio to ``detect`` and the objects it handled."""
    kept = _seg_kept(seg, input_hw, mapping)
    masks = kept.masks
    assert masks is not None
    candidates = decode_yolov8_obb(obb, input_hw, CONF)
    assert candidates.xywhr is not None
    xywhr = candidates.xywhr

    steps: dict[str, tuple[Callable[[], object], int]] = {
        "detect": (lambda: class_aware_nms(decode_yolov8(detect, input_hw, CONF), IOU, MAX_DET), 0),
        "seg-decode": (lambda: _seg_kept(seg, input_hw, mapping), len(kept)),
        "seg-masks": (lambda: [masks.bitmap(i) for i in range(len(masks))], len(masks)),
        "seg-outlines": (lambda: [masks.outline(i, 32) for i in range(len(masks))], len(masks)),
        "pose-decode": (
            lambda: class_aware_nms(decode_yolov8_pose(pose, input_hw, CONF, kpt_shape), IOU, MAX_DET),
            0,
        ),
        "obb-decode": (lambda: decode_yolov8_obb(obb, input_hw, CONF), len(candidates)),
        "obb-nms": (
            lambda: rotated_nms_indices(xywhr, candidates.confidence, IOU, MAX_DET, candidates.class_id),
            len(candidates),
        ),
    }
    medians = {name: _median_ms(step, frames) for name, (step, _) in steps.items()}
    base = medians["detect"]
    return {
        name: {"median_ms": round(medians[name], 4), "ratio_to_detect": round(medians[name] / base, 2), "objects": n}
        for name, (_, n) in steps.items()
    }


def demo_outputs() -> tuple[Outputs, Outputs, Outputs, Outputs, tuple[int, int], SourceMapping]:
    """The demo task models' real outputs (ONNX Runtime, 320 input) on one 640x480 synthetic frame."""
    from pipelines.decoding.detector import Detector
    from pipelines.sources.synthetic import SyntheticScene
    from runtimes.registry import load_runtime

    image, _ = SyntheticScene(640, 480, num_shapes=6, seed=310_001).render(0)
    found: list[Outputs] = []
    hw = (320, 320)
    for name in ("demo_segment.onnx", "demo_pose.onnx", "demo_obb.onnx", "demo_detector.onnx"):
        with load_runtime("onnxruntime", REPO / "agent" / "demo" / name) as runtime:
            detector = Detector(runtime)
            tensor, _ = detector.prepare(image)
            hw = detector.input_hw
            found.append([np.asarray(o, np.float32) for o in runtime.infer([tensor])])
    scale = hw[1] / 640
    mapping = SourceMapping(scale, scale, 0.0, (hw[0] - 480 * scale) / 2, (480, 640))
    return found[0], found[1], found[2], found[3], hw, mapping


def machine() -> str:
    cpu = platform.processor() or ""
    return f"{platform.machine()} {cpu} {platform.system()} Python {platform.python_version()}".strip()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--frames", type=int, default=200, help="Runs of each step (the median is reported).")
    parser.add_argument("--demo", action="store_true", help="Also time the demo task models' real outputs (320).")
    parser.add_argument("--json", action="store_true", help="Print one JSON document.")
    args = parser.parse_args(argv)
    if args.frames < 1:
        parser.error(f"--frames must be at least 1, got {args.frames}")
    report: dict[str, Any] = {"machine": machine(), "frames": args.frames}
    report["synthetic-640"] = measure(
        seg_outputs(), grid_output(51, 1), grid_output(1, 15), grid_output(0, 80), (640, 640), MAPPING, args.frames
    )
    if args.demo:
        seg, pose, obb, detect, hw, mapping = demo_outputs()
        report["demo-320"] = measure(seg, pose, obb, detect, hw, mapping, args.frames, kpt_shape=(3, 3))
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['machine']}, {args.frames} frames, medians")
    for kind in ("synthetic-640", "demo-320"):
        if kind in report:
            print(kind)
            for name, r in report[kind].items():
                print(f"  {name:13s} {r['median_ms']:9.3f} ms  x{r['ratio_to_detect']:<6} objects {r['objects']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
