#!/usr/bin/env python3
"""The FP32, FP16 and INT8 variants of one model side by side: size, latency, RSS, agreement.

The variants are made exactly as ``edge-agent bundle build --precisions fp32,fp16,int8`` makes
them (`agent.optimise.prepare`, the agreement gate off so every variant is measured). Each variant
then runs in its own process (so its peak RSS is its own), in an order reversed every round:
ONNX Runtime on the CPU, default options, one preprocessed validation image inferred `--runs`
times after 3 warm-up runs. Prints the median latency, its median per-round ratio to FP32, the
median RSS with the model loaded and run, and the median peak RSS of the process.

    python bench/variants.py agent/demo/demo_detector.onnx --images synthetic
    python bench/variants.py ../shared/models/yolox_nano_416.onnx --images photos \\
        --int8-activations asymmetric

`--images synthetic`: 32 frames of the synthetic scene (calibration and validation, disjoint
seeds); `photos`: scikit-image's photos with people, animals and objects, each also flipped and
cropped (calibration: half, validation: the other half); or a folder used for both.
Needs the ``build`` extra (and scikit-image for ``photos``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np

from agent.optimise.prepare import Options, prepare
from pipelines.sources.synthetic import SyntheticScene

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, statistics, sys, time
from pathlib import Path
import cv2, psutil
from pipelines.decoding.detector import Detector
from runtimes.registry import load_runtime
path, image, runs = Path(sys.argv[1]), cv2.imread(sys.argv[2]), int(sys.argv[3])
with load_runtime("onnxruntime", path) as runtime:
    tensor, _ = Detector(runtime).prepare(image)
    for _ in range(3):
        runtime.infer([tensor])
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        runtime.infer([tensor])
        times.append(time.perf_counter() - start)
    rss_mb = psutil.Process().memory_info().rss / 2**20  # the model loaded and run
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over an exec, so it would be this script's peak
peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
peak_mb = peak_kb / 1024
print(json.dumps({"ms": statistics.median(times) * 1000, "rss_mb": rss_mb, "peak_mb": peak_mb}))
"""

#: scikit-image sample photos that show COCO objects (person, cat, cup, clock, motorcycle, horse)
PHOTOS = ("astronaut", "camera", "chelsea", "coffee", "clock", "rocket", "horse")


def _synthetic(folder: Path) -> tuple[list[Path], list[Path]]:
    paths = []
    for i in range(32):
        path = folder / f"scene{i:02d}.png"
        cv2.imwrite(str(path), SyntheticScene(seed=8_000 + i, num_shapes=5).render(i * 7)[0])
        paths.append(path)
    return paths[::2], paths[1::2]


def _photos(folder: Path) -> tuple[list[Path], list[Path]]:
    from skimage import data

    images = [getattr(data, name)() for name in PHOTOS]
    images += list(data.stereo_motorcycle()[:2])
    paths = []
    for i, image in enumerate(images):
        image = np.stack([image] * 3, axis=-1) if image.ndim == 2 else image[..., :3]
        bgr = np.ascontiguousarray(image[..., ::-1])
        h, w = bgr.shape[:2]
        for j, view in enumerate((bgr, bgr[:, ::-1], bgr[h // 8 :, w // 8 :], bgr[: h - h // 8, : w - w // 8])):
            path = folder / f"photo{i:02d}_{j}.png"
            cv2.imwrite(str(path), view)
            paths.append(path)
    return paths[::2], paths[1::2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="an FP32 .onnx model")
    parser.add_argument("--images", default="synthetic", help="synthetic, photos, or a folder of .png/.jpg")
    parser.add_argument("--calibration-method", default="minmax", choices=("minmax", "entropy", "percentile"))
    parser.add_argument("--int8-activations", default="symmetric", choices=("symmetric", "asymmetric"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=50, help="timed inferences per variant per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-variants-") as tmp:
        work = Path(tmp)
        if args.images in ("synthetic", "photos"):
            calibration, validation = (_synthetic if args.images == "synthetic" else _photos)(work)
        else:
            calibration = validation = sorted(p for p in Path(args.images).iterdir() if p.suffix in (".png", ".jpg"))
        options = Options(
            precisions=("fp32", "fp16", "int8"),
            calibration=tuple(calibration),
            validation=tuple(validation),
            method=args.calibration_method,
            activations=args.int8_activations,
            min_agreement=0.0,
        )
        prepared = prepare([args.model], options, work, lambda line: print(line, file=sys.stderr))
        paths = {path.name: path for path in prepared.models}
        results: dict[str, list[dict[str, float]]] = {name: [] for name in paths}
        order = list(results)
        for round_ in range(args.rounds):
            for name in order if round_ % 2 == 0 else order[::-1]:
                child = [sys.executable, "-c", CHILD, str(paths[name]), str(validation[0]), str(args.runs)]
                out = subprocess.run(child, cwd=REPO, capture_output=True, text=True, check=True).stdout
                results[name].append(json.loads(out.splitlines()[-1]))
                print(f"round {round_} {name}: {results[name][-1]}", file=sys.stderr)
        fp32 = order[0]
        print(f"{'variant':<28} {'bytes':>9} {'latency ms':>10} {'vs fp32':>8} {'RSS MB':>7} {'peak MB':>7} agreement")
        for name in order:
            note = prepared.notes[name]
            ratio = statistics.median(r["ms"] / b["ms"] for r, b in zip(results[name], results[fp32], strict=True))
            agreement = note.agreement
            agreed = (
                f"{agreement.detections:.3f} ({agreement.matched}/{agreement.baseline_detections})"
                if agreement
                else "-"
            )
            print(
                f"{name:<28} {paths[name].stat().st_size:>9} {statistics.median(r['ms'] for r in results[name]):>10.2f}"
                f" {ratio:>8.2f} {statistics.median(r['rss_mb'] for r in results[name]):>7.1f}"
                f" {statistics.median(r['peak_mb'] for r in results[name]):>7.1f} {agreed}"
            )


if __name__ == "__main__":
    main()
