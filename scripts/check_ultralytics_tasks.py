#!/usr/bin/env python3
"""Check: the shipped task models (agent/demo/demo_{segment,pose,obb,classify}*) give the same
answers through edge-agent as through Ultralytics' own ``predict``.

Ultralytics (AGPL-3.0, with PyTorch) lives only in a separate environment, never in the
project's. For each model file and each test image (synthetic frames at two sizes, so the
letterbox pads both ways; for the classifier, crops of single shapes), that environment runs
``YOLO(file, task=...).predict`` and this script runs edge-agent's `Detector` (or `Classifier`)
on the same file and image, at Ultralytics' defaults (conf 0.25, IoU 0.7). Detections are
paired by class and box; the checks (issue 25):

- masks: IoU >= 0.9 with Ultralytics' masks (its ``masks.data`` scaled to the image as its
  ``scale_masks`` does), for every pair;
- keypoints: every keypoint within 1 pixel;
- oriented boxes: every corner within 1 pixel;
- classification: the same top-1 class and its score within 0.01;
- the same number of detections.

    python3 -m venv /work/ul-env
    /work/ul-env/bin/pip install torch==2.15.0 torchvision==0.29.2 ultralytics==8.4.190 onnx onnxruntime ai-edge-litert
    YOLO_OFFLINE=1 .venv/bin/python scripts/check_ultralytics_tasks.py --ultralytics-python /work/ul-env/bin/python

Prints one line per model file and image and a table per file; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import cv2
import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "agent" / "demo"
FILES = {
    "segment": [
        "demo_segment.onnx",
        "demo_segment_e2e.onnx",
        "demo_segment_fp32.tflite",
        "demo_segment_e2e_fp32.tflite",
        "demo_segment_int8.tflite",
    ],
    "pose": [
        "demo_pose.onnx",
        "demo_pose_e2e.onnx",
        "demo_pose_fp32.tflite",
        "demo_pose_e2e_fp32.tflite",
        "demo_pose_int8.tflite",
    ],
    "obb": [
        "demo_obb.onnx",
        "demo_obb_e2e.onnx",
        "demo_obb_fp32.tflite",
        "demo_obb_e2e_fp32.tflite",
        "demo_obb_int8.tflite",
    ],
    "classify": ["demo_classify.onnx", "demo_classify_fp32.tflite", "demo_classify_int8.tflite"],
}
CONF, IOU = 0.25, 0.7
MASK_IOU, PIXELS, SCORE = 0.9, 1.0, 0.01

ULTRALYTICS_SIDE = """
import json, sys
import numpy as np
import torch
from ultralytics import YOLO
from ultralytics.utils import ops
path, task, conf, iou, masks_out = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
images = json.loads(sys.argv[6])
model = YOLO(path, task=task)
answers, masks = [], {}
for n, image in enumerate(images):
    r = model.predict(image, conf=conf, iou=iou, verbose=False)[0]
    if task == "classify":
        answers.append({"scores": r.probs.data.tolist()})
        continue
    boxes = r.obb if task == "obb" else r.boxes
    out = {"xyxy": boxes.xyxy.tolist(), "conf": boxes.conf.tolist(), "cls": boxes.cls.tolist()}
    if task == "obb":
        out["corners"] = r.obb.xyxyxyxy.tolist()
    if task == "pose":
        out["keypoints"] = r.keypoints.data.tolist()
    if task == "segment" and r.masks is not None:
        scaled = ops.scale_masks(r.masks.data[None].float(), r.orig_shape)[0] > 0.5
        masks[str(n)] = scaled.cpu().numpy()
    answers.append(out)
np.savez_compressed(masks_out, **masks)
print(json.dumps(answers))
"""


def test_images(folder: Path) -> tuple[list[Path], list[Path]]:
    """Synthetic frames (640x480 and 480x640, so the letterbox pads y, then x) and shape crops."""
    from pipelines.sources.synthetic import SyntheticScene

    frames, crops = [], []
    for i, (width, height, seed) in enumerate(((640, 480, 300_001), (480, 640, 300_002), (640, 480, 300_003))):
        image, truth = SyntheticScene(width, height, num_shapes=6, seed=seed).render(7 * i)
        path = folder / f"frame{i}.png"
        cv2.imwrite(str(path), image)
        frames.append(path)
        for j, box in enumerate(truth.detections.xyxy[truth.visible > 0.8][:3]):
            x1, y1, x2, y2 = (int(v) for v in box)
            crop = folder / f"crop{i}_{j}.png"
            cv2.imwrite(str(crop), image[max(y1 - 6, 0) : y2 + 6, max(x1 - 6, 0) : x2 + 6])
            crops.append(crop)
    return frames, crops


def ultralytics(python: str, path: Path, task: str, images: list[Path], masks_out: Path) -> list[dict[str, Any]]:
    args = [python, "-c", ULTRALYTICS_SIDE, str(path), task, str(CONF), str(IOU), str(masks_out)]
    done = subprocess.run([*args, json.dumps([str(p) for p in images])], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"Ultralytics failed on {path.name}:\n{done.stderr[-3000:]}")
    answers: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return answers


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return float(w * h / union) if union > 0 else 0.0


def pairs(theirs: dict[str, Any], found: Any) -> list[tuple[int, int]]:
    """(theirs, ours) index pairs: the same class and the best-overlapping box, greedily by score."""
    taken: set[int] = set()
    out = []
    for i, (box, cls) in enumerate(zip(theirs["xyxy"], theirs["cls"], strict=True)):
        best, best_iou = -1, 0.5
        for j in range(len(found)):
            if j in taken or int(found.class_id[j]) != int(cls):
                continue
            overlap = _iou(np.asarray(box), found.xyxy[j])
            if overlap > best_iou:
                best, best_iou = j, overlap
        if best >= 0:
            taken.add(best)
            out.append((i, best))
    return out


def corner_error(a: np.ndarray, b: np.ndarray) -> float:
    """Largest corner distance, over the four rotations of the corner order (the same rectangle)."""
    return min(float(np.linalg.norm(a - np.roll(b, k, axis=0), axis=1).max()) for k in range(4))


def check_file(python: str, path: Path, task: str, frames: list[Path], crops: list[Path], tmp: Path) -> dict[str, Any]:
    from pipelines.decoding.classifier import Classifier
    from pipelines.decoding.detector import Detector
    from pipelines.decoding.rotated import corners
    from runtimes.registry import load_runtime

    images = crops if task == "classify" else frames
    masks_out = tmp / f"{path.stem}_masks.npz"
    theirs = ultralytics(python, path, task, images, masks_out)
    their_masks = np.load(masks_out) if task == "segment" else None
    stats: dict[str, Any] = {"theirs": 0, "ours": 0, "paired": 0, "worst": None, "ok": True}
    worst: list[float] = []
    with load_runtime("onnxruntime" if path.suffix == ".onnx" else "litert", path) as runtime:
        if task == "classify":
            classifier = Classifier(runtime)
            for image, answer in zip(images, theirs, strict=True):
                mine = classifier.classify(cv2.imread(str(image)))
                top_theirs = int(np.argmax(answer["scores"]))
                (top_mine, score_mine), *_ = mine.top(1)
                error = abs(score_mine - answer["scores"][top_theirs])
                worst.append(error)
                stats["theirs"] += 1
                stats["ours"] += 1
                stats["paired"] += top_mine == top_theirs
                stats["ok"] &= top_mine == top_theirs and error <= SCORE
            stats["worst"] = max(worst)
            return stats
        detector = Detector(runtime, conf=CONF, iou=IOU)
        stats["decoder"] = detector.decoder
        for n, (image, answer) in enumerate(zip(images, theirs, strict=True)):
            found = detector.detect(cv2.imread(str(image)))
            matched = pairs(answer, found)
            stats["theirs"] += len(answer["xyxy"])
            stats["ours"] += len(found)
            stats["paired"] += len(matched)
            for i, j in matched:
                if task == "segment":
                    assert their_masks is not None and found.masks is not None
                    a, b = their_masks[str(n)][i], found.masks.bitmap(j)
                    worst.append(float((a & b).sum() / max((a | b).sum(), 1)))
                elif task == "pose":
                    assert found.keypoints is not None
                    mine = found.keypoints[j, :, :2]
                    worst.append(float(np.linalg.norm(np.asarray(answer["keypoints"][i])[:, :2] - mine, axis=1).max()))
                else:
                    assert found.xywhr is not None
                    mine = corners(found.xywhr[j : j + 1])[0]
                    worst.append(corner_error(np.asarray(answer["corners"][i]), mine))
    if worst:
        stats["worst"] = min(worst) if task == "segment" else max(worst)
        limit_ok = stats["worst"] >= MASK_IOU if task == "segment" else stats["worst"] <= PIXELS
    else:
        limit_ok = True
    stats["ok"] = limit_ok and stats["theirs"] == stats["ours"] == stats["paired"]
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ultralytics-python", required=True, help="python of the separate Ultralytics environment")
    parser.add_argument("--models", type=Path, default=DEMO, help="folder with the task models (default agent/demo)")
    parser.add_argument("--tasks", nargs="+", choices=sorted(FILES), default=list(FILES))
    args = parser.parse_args()
    failed = False
    measure = {
        "segment": "min mask IoU",
        "pose": "max keypoint px",
        "obb": "max corner px",
        "classify": "max score diff",
    }
    print("| task | file | runtime | precision | detections (Ultralytics / edge-agent / paired) | worst | result |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        frames, crops = test_images(tmp)
        for task in args.tasks:
            for name in FILES[task]:
                path = args.models / name
                if not path.is_file():
                    print(f"| {task} | {name} | - | - | missing | - | skipped |")
                    continue
                stats = check_file(args.ultralytics_python, path, task, frames, crops, tmp)
                failed |= not stats["ok"]
                runtime = "ONNX Runtime" if path.suffix == ".onnx" else "LiteRT"
                precision = "int8" if "int8" in name else "fp32"
                worst = "-" if stats["worst"] is None else f"{measure[task]} {stats['worst']:.4g}"
                counts = f"{stats['theirs']} / {stats['ours']} / {stats['paired']}"
                result = "ok" if stats["ok"] else "FAIL"
                print(f"| {task} | {name} | {runtime} | {precision} | {counts} | {worst} | {result} |")
                sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
