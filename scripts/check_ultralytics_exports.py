#!/usr/bin/env python3
"""Check: real Ultralytics exports decode as Ultralytics itself decodes them.

Ultralytics (AGPL-3.0, with PyTorch) lives only in a separate environment, never in the
project's: that environment exports each model below with random weights (from its YAML,
nothing downloaded) to ONNX and to LiteRT (.tflite, through litert-torch) and predicts on
scikit-image's ``chelsea``; this script then runs `pipelines.decoding.detector.Detector` on the same
export and photo and compares the decoder chosen and the detections (boxes clipped to the
photo, within a pixel; scores within 1e-3) at Ultralytics' default NMS IoU threshold, 0.7.

    python3 -m venv /tmp/ul
    /tmp/ul/bin/pip install torch torchvision ultralytics onnx onnxslim onnxruntime litert-torch
    YOLO_OFFLINE=1 .venv/bin/python scripts/check_ultralytics_exports.py --ultralytics-python /tmp/ul/bin/python

Random weights give scores near zero, hence the low default ``--conf``. Exit status 1 when an
export decodes differently.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

# (model YAML, export format, export arguments, the decoder expected)
EXPORTS = [
    ("yolov8n.yaml", "onnx", {"nms": True, "conf": 0.0001}, "end2end"),  # NMS in the graph at this threshold
    ("yolo26n.yaml", "onnx", {"nms": False}, "end2end"),
    ("yolov10n.yaml", "onnx", {"nms": False}, "end2end"),
    ("yolo26n.yaml", "onnx", {}, "yolov8"),
    ("rtdetr-l.yaml", "onnx", {}, "rtdetr"),
    ("yolov8n.yaml", "litert", {"nms": True, "conf": 0.0001}, "yolov8"),  # 8.4.190: no nms for LiteRT
    ("yolo26n.yaml", "litert", {"nms": False}, "end2end"),
    ("yolo26n.yaml", "litert", {}, "yolov8"),
    ("rtdetr-l.yaml", "litert", {}, "rtdetr"),
]

ULTRALYTICS_SIDE = """
import json, sys
from ultralytics import RTDETR, YOLO
yaml, fmt, args, image = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
conf, imgsz = float(sys.argv[5]), int(sys.argv[6])
cls = RTDETR if yaml.startswith("rtdetr") else YOLO
path = cls(yaml).export(format=fmt, imgsz=imgsz, **args)
model = RTDETR(path) if cls is RTDETR else YOLO(path, task="detect")
r = model.predict(image, conf=conf, imgsz=imgsz, verbose=False)[0]
rows = [[*b, float(s), int(c)] for b, s, c in zip(r.boxes.xyxy.tolist(), r.boxes.conf.tolist(), r.boxes.cls.tolist())]
print(json.dumps({"path": str(path), "rows": rows}))
"""


def ours(path: Path, image: np.ndarray, conf: float) -> tuple[str, list[list[float]]]:
    from pipelines.decoding.detector import Detector
    from runtimes.registry import load_runtime

    with load_runtime("onnxruntime" if path.suffix == ".onnx" else "litert", path) as runtime:
        detector = Detector(runtime, conf=conf, iou=0.7)  # Ultralytics' default IoU threshold
        found = detector.detect(image)
        rows = [
            [*box.tolist(), float(s), int(c)]
            for box, s, c in zip(found.xyxy, found.confidence, found.class_id, strict=True)
        ]
        return detector.decoder, rows


def agree(theirs: list[list[float]], mine: list[list[float]], hw: tuple[int, int], top: int) -> bool:
    """The same detections, the best `top` compared one by one (ordered by score, then class and
    box, as random weights give many equal scores): class, score within 1e-3, box within a pixel
    once clipped to the photo."""
    if len(theirs) != len(mine):
        return False
    a, b = np.asarray(theirs).reshape(-1, 6), np.asarray(mine).reshape(-1, 6)
    for rows in (a, b):
        rows[:, [0, 2]] = rows[:, [0, 2]].clip(0, hw[1])
        rows[:, [1, 3]] = rows[:, [1, 3]].clip(0, hw[0])
    a, b = (r[np.lexsort((r[:, 1].round(), r[:, 0].round(), r[:, 5], -r[:, 4].round(4)))][:top] for r in (a, b))
    return bool(
        np.array_equal(a[:, 5], b[:, 5])
        and np.allclose(a[:, 4], b[:, 4], atol=1e-3)
        and np.allclose(a[:, :4], b[:, :4], atol=1.0)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ultralytics-python", required=True, help="python of an environment with ultralytics")
    parser.add_argument("--conf", type=float, default=0.0001)
    parser.add_argument("--imgsz", type=int, default=320)
    parser.add_argument("--top", type=int, default=20, help="detections compared one by one")
    args = parser.parse_args()
    import cv2
    from skimage import data

    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        image_path = Path(folder) / "chelsea.png"
        cv2.imwrite(str(image_path), data.chelsea()[..., ::-1])
        image = cv2.imread(str(image_path))
        for yaml, fmt, export_args, expected in EXPORTS:
            run = subprocess.run(
                [
                    args.ultralytics_python,
                    "-c",
                    ULTRALYTICS_SIDE,
                    yaml,
                    fmt,
                    json.dumps(export_args),
                    str(image_path),
                    str(args.conf),
                    str(args.imgsz),
                ],
                capture_output=True,
                text=True,
                cwd=folder,
                timeout=600,
            )
            if run.returncode != 0:
                print(f"FAIL {yaml} {fmt} {export_args}: ultralytics failed: {run.stderr.strip()[-300:]}")
                failures += 1
                continue
            theirs = json.loads(run.stdout.strip().splitlines()[-1])
            decoder, mine = ours(Path(folder) / theirs["path"], image, args.conf)
            ok = decoder == expected and agree(theirs["rows"], mine, image.shape[:2], args.top)
            failures += not ok
            print(
                f"{'ok  ' if ok else 'FAIL'} {yaml:<14} {fmt:<7} {json.dumps(export_args):<30} decoder {decoder:<8} "
                f"(expected {expected}); detections: ultralytics {len(theirs['rows'])}, edge-agent {len(mine)}"
            )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
