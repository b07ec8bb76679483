#!/usr/bin/env python3
"""Side-by-side pipeline benchmark: edge-agent vs a bare ONNX Runtime loop vs Ultralytics.

A YOLOv8n-architecture model with random weights (640x640, and a dynamic height/width export
of the same network) runs on a 1280x720 synthetic clip, every frame processed. Each contender
runs in its own process, in turn, for several rounds; medians are reported.

- ``bare``: ``InferenceSession.run`` in a loop on one pre-made tensor (the issue's ceiling:
  ONNX Runtime's default threads, one call at a time);
- ``bare_2x1``: the same session with one intra-op thread, called from two threads at once
  (the ceiling of two frames in flight);
- ``edge-agent default`` / ``edge-agent fixed --workers 1`` / ``edge-agent fixed --workers 2`` /
  ``edge-agent dynamic``: ``edge-agent bench MODEL --source clip [--workers 1|2]``, the first
  with the default configuration (``--workers auto``: the faster of 1 and 2, measured briefly);
  the two bare loops and the two fixed runs go back to back, in an order reversed every round,
  and the medians of the per-round ratios (``*_paired``) cancel the VM's slow swings in speed;
- ``ultralytics``: ``YOLO(onnx).predict(source=clip, stream=True)``, steady-state FPS
  (first to last result, so its model loading is not counted against it);
- start-up: process start to the first detection printed, for ``edge-agent detect`` and for
  Ultralytics' predict on one image.

Ultralytics (AGPL-3.0) is never a dependency: it lives in a separate virtual environment whose
python is passed with ``--ultralytics-python``; that environment also exports the models.
Without one, ``--fixed-model`` names the 640x640 YOLOv8n ONNX to use (bench/yolov8n_fp32.py
makes one from the shared COCO model) and the Ultralytics and dynamic-model contenders are left out.

    python bench/pipeline.py --ultralytics-python /path/to/benchenv/bin/python [--rounds 3]
    python bench/pipeline.py --fixed-model build/bench/yolov8n_640.onnx [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import ort_options  # scripts/ is on the path when this runs as a script

REPO = Path(__file__).resolve().parent.parent
EDGE_AGENT = [sys.executable, "-m", "agent.cli"]

EXPORT = """
import shutil, sys
from ultralytics import YOLO
dynamic = sys.argv[1] == "dynamic"
model = YOLO("yolov8n.yaml")  # the architecture with random weights: nothing is downloaded
path = model.export(format="onnx", imgsz=640, dynamic=dynamic, simplify=True)
shutil.move(path, sys.argv[2])
"""

# the bare loops: inference alone on one pre-made tensor, N calls at once, ORT's memory pattern on
BARE = ort_options.VARIANT

ULTRALYTICS = """
import json, resource, sys, time
from ultralytics import YOLO
model = YOLO(sys.argv[1], task="detect")
stamps = []
for result in model.predict(source=sys.argv[2], stream=True, verbose=False, imgsz=640):
    stamps.append(time.perf_counter())
    if len(stamps) == 1:
        print("FIRST", flush=True)
fps = (len(stamps) - 1) / (stamps[-1] - stamps[0])
rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"fps": fps, "frames": len(stamps), "rss_mb": rss_mb}))
"""


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def run_json(cmd: list[str], cwd: Path = REPO) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_to_first_line(cmd: list[str], marker: str) -> float:
    """Seconds from process start to the first stdout line containing `marker`."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    assert proc.stdout is not None
    for line in proc.stdout:
        if marker in line:
            elapsed = time.perf_counter() - start
            proc.stdout.read()
            proc.wait()
            return elapsed
    proc.wait()
    sys.exit(f"no {marker!r} from {' '.join(cmd)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ultralytics-python", help="python of the separate Ultralytics venv")
    parser.add_argument("--fixed-model", type=Path, help="a 640x640 YOLOv8n ONNX (without an Ultralytics venv)")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--frames", type=int, default=300, help="frames in the 1280x720 clip")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.ultralytics_python is None and args.fixed_model is None:
        parser.error("give --ultralytics-python (exports the models, runs Ultralytics) or --fixed-model")
    ultra_py = args.ultralytics_python
    fixed, dynamic = work / "yolov8n_random_640.onnx", work / "yolov8n_random_dynamic.onnx"
    if args.fixed_model is not None:
        fixed = args.fixed_model.resolve()
    for path, kind in ((fixed, "fixed"), (dynamic, "dynamic")) if ultra_py else ():
        if not path.exists():
            subprocess.run([ultra_py, "-c", EXPORT, kind, str(path)], cwd=work, check=True)
    clip = work / "scene.mp4"
    if not clip.exists():
        subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts" / "make_demo_media.py"),
                str(work),
                "--size",
                "1280x720",
                "--frames",
                str(args.frames),
            ],
            check=True,
        )
    image = work / "scene.png"

    names = ["bare", "bare_2x1", "edge_default", "edge_fixed", "edge_fixed_w2"]
    names += ["edge_dynamic", "ultralytics"] if ultra_py else []
    results: dict[str, list[dict]] = {k: [] for k in names}
    startup: dict[str, list[float]] = {"edge_agent_detect": [], **({"ultralytics_predict": []} if ultra_py else {})}
    bench = [*EDGE_AGENT, "bench", str(fixed), "--source", str(clip), "--json"]
    side_by_side = [
        ("bare", [sys.executable, "-c", BARE, str(fixed), str(args.frames), "1", "on"]),
        ("edge_default", bench),  # the default configuration: --workers auto
        ("edge_fixed", [*bench, "--workers", "1"]),
        ("edge_fixed_w2", [*bench, "--workers", "2"]),
        ("bare_2x1", [sys.executable, "-c", BARE, str(fixed), str(args.frames), "2", "on"]),
    ]
    for round_ in range(args.rounds):
        for name, cmd in side_by_side if round_ % 2 == 0 else side_by_side[::-1]:
            results[name].append(run_json(cmd))
        startup["edge_agent_detect"].append(
            time_to_first_line([*EDGE_AGENT, "detect", str(fixed), str(image)], "detection")
        )
        if ultra_py:
            results["edge_dynamic"].append(
                run_json([*EDGE_AGENT, "bench", str(dynamic), "--source", str(clip), "--json"])
            )
            results["ultralytics"].append(run_json([ultra_py, "-c", ULTRALYTICS, str(fixed), str(clip)], cwd=work))
            startup["ultralytics_predict"].append(
                time_to_first_line([ultra_py, "-c", ULTRALYTICS, str(fixed), str(image)], "FIRST")
            )
        print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[key] for r in results[name]), 2)

    def paired(name: str, reference: str) -> float:
        ratios = (e["fps"] / b["fps"] for e, b in zip(results[name], results[reference], strict=True))
        return round(statistics.median(ratios), 3)

    bare = median("bare", "fps")
    summary = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {cpu_model()}",
        "model": str(fixed),
        "frames": args.frames,
        "rounds": args.rounds,
        "fps": {name: median(name, "fps") for name in results},
        "rss_mb": {name: median(name, "rss_mb") for name in results},
        "default_workers": [r["workers"] for r in results["edge_default"]],
        "default_vs_bare": round(median("edge_default", "fps") / bare, 3),
        "default_vs_bare_paired": paired("edge_default", "bare"),
        "fixed_vs_bare": round(median("edge_fixed", "fps") / bare, 3),
        "fixed_vs_bare_paired": paired("edge_fixed", "bare"),
        "fixed_w2_vs_bare": round(median("edge_fixed_w2", "fps") / bare, 3),
        "fixed_w2_vs_bare_paired": paired("edge_fixed_w2", "bare"),
        "fixed_w2_vs_bare_2x1_paired": paired("edge_fixed_w2", "bare_2x1"),
        "startup_s": {name: round(statistics.median(v), 3) for name, v in startup.items()},
        "all_fps": {name: [round(r["fps"], 2) for r in runs] for name, runs in results.items()},
    }
    if ultra_py:
        ultra = median("ultralytics", "fps")
        summary["edge_dynamic_input"] = results["edge_dynamic"][0]["input_shape"]
        summary["fixed_vs_ultralytics"] = round(median("edge_fixed", "fps") / ultra, 3)
        summary["fixed_w2_vs_ultralytics"] = round(median("edge_fixed_w2", "fps") / ultra, 3)
        summary["dynamic_vs_ultralytics"] = round(median("edge_dynamic", "fps") / ultra, 3)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
