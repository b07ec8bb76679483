#!/usr/bin/env python3
"""What a shadow costs the serving cameras (issue 38; docs/benchmarks.md, "The shadow's cost"):
serving FPS and the process's CPU with a candidate shadowing at `--share` (the default
``deployments.shadow.sample_share``, 0.1) against without, side by side in one run, on `--cores`
cores; and the resident memory with one model loaded and with two.

One process, the serving side as the daemon runs it (`agent.serving.cameras.Cameras`, the
version installed in a temporary store): `--cameras` synthetic cameras at up to 1000 FPS, so
the serving side is bound by the CPU, the worst case for a shadow (a camera capped at its
15 FPS leaves cores idle). The candidate is the same network signed as another version (what a
shadow costs does not depend on what it finds). Each round measures `--seconds` without a
shadow, then `--seconds` with one (the order swapped every other round, so drift on a shared
machine falls on both alike); medians over rounds, and the ratio with / without.

    .venv/bin/python bench/shadow_cost.py [--model M.onnx] [--cores 1|2] [--share 0.1] [--rounds 5]
        [--seconds 10] [--cameras 1] [--json]

The model defaults to YOLOv8n int8 640 from ``../shared/models`` when present, else the demo
detector. RSS: after the serving version is warm, and again once the shadow has compared its
first frames (its model loaded and run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("EDGE_AGENT_SHARED_MODELS", REPO.parent / "shared" / "models"))
sys.path.insert(0, str(REPO))

from agent.bundles.archive import build_bundle  # noqa: E402
from agent.bundles.installer import InstallPolicy, install  # noqa: E402
from agent.bundles.store import Store  # noqa: E402
from agent.config.models import CameraSection, ShadowSection  # noqa: E402
from agent.hardware.board import probe  # noqa: E402
from agent.serving.cameras import Cameras  # noqa: E402
from pipelines.pipeline import use_one_opencv_thread  # noqa: E402


def default_model() -> Path:
    shared = SHARED / "yolov8n_int8_640.onnx"
    return shared if shared.is_file() else REPO / "agent" / "demo" / "demo_detector.onnx"


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def frames(cameras: Cameras) -> int:
    return sum(s.frames for s in cameras.stats())


def measure(cameras: Cameras, seconds: float) -> tuple[float, float]:
    """Serving FPS (all cameras) and the process's CPU (cores busy) over `seconds`."""
    process = psutil.Process()
    start_frames, start_cpu, start = frames(cameras), process.cpu_times(), time.monotonic()
    time.sleep(seconds)
    end_frames, end_cpu, elapsed = frames(cameras), process.cpu_times(), time.monotonic() - start
    cpu = (end_cpu.user + end_cpu.system) - (start_cpu.user + start_cpu.system)
    return (end_frames - start_frames) / elapsed, cpu / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--cores", type=int, default=None, help="pin the process to this many cores (default: all)")
    parser.add_argument("--share", type=float, default=ShadowSection().sample_share)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--cameras", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.cores is not None:
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cores]))
    use_one_opencv_thread()
    model = args.model or default_model()
    with tempfile.TemporaryDirectory(prefix="shadow-cost-") as tmp:
        folder = Path(tmp)
        store = Store(folder / "state")
        policy = InstallPolicy(allow_unsigned=True, autotune=False)
        versions = []
        for version in ("1.0.0", "1.1.0"):
            bundle = folder / f"{version}.bundle"
            build_bundle([model], bundle, name="cost", version=version)
            versions.append(store.versions / install(bundle, store, probe(), policy).sha256)
        sections = [
            CameraSection(name=f"cam{i}", source=f"synthetic:{i}", fps=1000, width=640, height=480)
            for i in range(args.cameras)
        ]
        cameras = Cameras(sections, probe(), "onnxruntime")
        try:
            cameras.activate(versions[0])
            deadline = time.monotonic() + 120
            while frames(cameras) < 20 * args.cameras and time.monotonic() < deadline:
                time.sleep(0.2)
            measure(cameras, 2.0)  # warm
            one_model_mb = rss_mb()
            without: list[tuple[float, float]] = []
            with_shadow: list[tuple[float, float]] = []
            compared = 0
            two_models_mb = 0.0
            for round_ in range(args.rounds):
                order = ("without", "with") if round_ % 2 == 0 else ("with", "without")
                for side in order:
                    if side == "without":
                        without.append(measure(cameras, args.seconds))
                        continue
                    session = cameras.shadow(versions[1], args.share)
                    try:
                        waiting = time.monotonic() + 120
                        while sum(r.frames for r in session.reports().values()) < 2:  # both models loaded, run
                            if time.monotonic() > waiting:
                                sys.exit("the shadow compared no frame in 120 s")
                            time.sleep(0.05)
                        two_models_mb = max(two_models_mb, rss_mb())
                        with_shadow.append(measure(cameras, args.seconds))
                        compared += sum(r.frames for r in session.reports().values())
                    finally:
                        session.close()
        finally:
            cameras.stop()
    fps_without = statistics.median(f for f, _ in without)
    fps_with = statistics.median(f for f, _ in with_shadow)
    cpu_without = statistics.median(c for _, c in without)
    cpu_with = statistics.median(c for _, c in with_shadow)
    report: dict[str, Any] = {
        "model": model.name,
        "cores": len(os.sched_getaffinity(0)),
        "cpu": platform.processor() or platform.machine(),
        "cameras": args.cameras,
        "share": args.share,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "fps_without": [round(f, 1) for f, _ in without],
        "fps_with": [round(f, 1) for f, _ in with_shadow],
        "median_fps_without": round(fps_without, 1),
        "median_fps_with": round(fps_with, 1),
        "fps_ratio": round(fps_with / fps_without, 3),
        "median_cpu_without": round(cpu_without, 2),
        "median_cpu_with": round(cpu_with, 2),
        "shadow_frames_compared": compared,
        "rss_one_model_mb": round(one_model_mb, 1),
        "rss_two_models_mb": round(two_models_mb, 1),
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{model.name} on {report['cores']} core(s), {args.cameras} camera(s), share {args.share:g}")
    print(f"  serving FPS without a shadow: {report['fps_without']} median {fps_without:.1f}")
    print(f"  serving FPS with a shadow:    {report['fps_with']} median {fps_with:.1f}  ({report['fps_ratio']:.3f}x)")
    print(f"  CPU (cores busy): without {cpu_without:.2f}, with {cpu_with:.2f}")
    print(f"  frames the shadow compared: {compared} in {args.rounds} x {args.seconds:g} s")
    print(f"  RSS: one model {one_model_mb:.1f} MB, two models {two_models_mb:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
