#!/usr/bin/env python3
"""One model, many cameras: the daemon's memory and FPS with a shared model, batched or not,
against a model per camera, side by side in one run (docs/benchmarks.md).

Every scenario runs the real daemon (`agent.daemon.agent.Agent`, no broker) in a fresh process
on synthetic cameras, with the YOLOv8n int8 640 bundle installed (``../shared/models``):

- memory: 1 camera shared, 4 cameras shared, 4 cameras with a model each (``share_model:
  false``, the behaviour before this change), cameras at 2 FPS; ``system.process_rss_mb`` as
  telemetry reports it, the median of samples once warm;
- throughput: 4 cameras at 3 FPS each (more than the model serves on a small CPU): a model
  each (the fixed export), one shared model frame by frame (the fixed export), one shared model batched (a
  dynamic-batch export of the same file, made here: batch axis opened, the head's reshapes
  taking the batch from their input); frames inferred over all cameras per second, and per
  second of the daemon's CPU time (the development VM is shared: its wall-clock FPS swings with
  the other tenants' load, the CPU time it got is measured too).

Scenarios run in turn, in an order reversed every round; the report gives per-scenario medians
and the per-round ratios' medians.

    .venv/bin/python bench/cameras.py [--rounds 3] [--json] [--quick] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODEL = Path(os.environ.get("EDGE_AGENT_SHARED_MODELS", REPO.parent / "shared" / "models")) / "yolov8n_int8_640.onnx"

#: name -> (cameras, camera fps, share_model, bundle, warm-up s, measured s)
SCENARIOS: dict[str, tuple[int, float, bool, str, float, float]] = {
    "rss 1 shared": (1, 2.0, True, "fixed", 25.0, 15.0),
    "rss 4 shared": (4, 2.0, True, "fixed", 25.0, 15.0),
    "rss 4 separate": (4, 2.0, False, "fixed", 25.0, 15.0),
    "fps 4 separate": (4, 3.0, False, "fixed", 25.0, 40.0),
    "fps 4 shared": (4, 3.0, True, "fixed", 25.0, 40.0),
    "fps 4 shared batched": (4, 3.0, True, "dynamic", 25.0, 40.0),
}
#: glibc's default malloc policy instead of `runtimes.base.compact_malloc` (--only these)
MALLOC_DEFAULTS: dict[str, tuple[int, float, bool, str, float, float]] = {
    "rss 1 shared glibc defaults": (1, 2.0, True, "fixed", 25.0, 15.0),
    "rss 4 shared glibc defaults": (4, 2.0, True, "fixed", 25.0, 15.0),
}
#: with --baseline DIR (a checkout of the code before this change): the issue's "today" numbers
BASELINE: dict[str, tuple[int, float, bool, str, float, float]] = {
    "rss 1 baseline": (1, 2.0, False, "fixed", 25.0, 15.0),
    "rss 4 baseline": (4, 2.0, False, "fixed", 25.0, 15.0),
}

CHILD = """
import json, os, sys, time
from agent.config.models import AgentConfig
from agent.daemon.agent import Agent
from agent.hardware.board import probe

spec = json.loads(sys.argv[1])
if spec.get("malloc_defaults"):  # glibc's own policy, to see what compact_malloc saves
    import agent.daemon.agent
    agent.daemon.agent.compact_malloc = lambda: False
config = AgentConfig.model_validate({
    "state_dir": spec["state_dir"], "allow_unsigned": True, "log_level": "warning",
    "telemetry": {"interval_s": 1.0},
    **({"serving": {"share_model": spec["share"]}} if spec["share"] is not None else {}),
    # the baseline (older code) knows the cameras' list by its old name only
    ("pipelines" if spec["share"] is None else "cameras"): [
        {"name": f"cam{i}", "source": f"synthetic:{i + 1}", "fps": spec["fps"]} for i in range(spec["cameras"])
    ],
})
agent = Agent(config, probe())
agent.start()
try:
    time.sleep(spec["warm"])
    start, first, cpu = time.monotonic(), agent.snapshot(), os.times()
    rss = []
    while time.monotonic() - start < spec["measure"]:
        time.sleep(1.0)
        if (system := agent.snapshot().system) is not None:
            rss.append(system.process_rss_mb)
    seconds, last, cpu_end = time.monotonic() - start, agent.snapshot(), os.times()
finally:
    agent.stop()
frames = sum(c.frames for c in last.cameras) - sum(c.frames for c in first.cameras)
cpu_s = (cpu_end.user - cpu.user) + (cpu_end.system - cpu.system)
print(json.dumps({
    "rss_mb": sorted(rss)[len(rss) // 2], "fps": frames / seconds, "frames_per_cpu_s": frames / cpu_s,
    "cpu_share": cpu_s / seconds, "load": os.getloadavg()[0], "runtime": last.cameras[0].runtime,
    "shared_by": [getattr(c, "shared_by", 1) for c in last.cameras],  # the baseline's cameras have neither
    "mean_batch": [getattr(c, "mean_batch", 1.0) for c in last.cameras],
}))
"""


def dynamic_batch_export(source: Path, out: Path) -> Path:
    """`source` (an Ultralytics export with batch 1 fixed) with its batch axis opened: the input
    and output take any batch, and the head's reshapes of activations copy the batch from their
    input (a leading 0) instead of 1. Checked: a batch of two copies of a frame gives that frame's
    outputs alone twice (identical frames, so dynamic quantization's one scale per batch is the
    frame's own)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    for value in (*graph.input, *graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    constants = {init.name: init for init in graph.initializer}
    for node in graph.node:
        shape = constants.get(node.input[1]) if node.op_type == "Reshape" and len(node.input) > 1 else None
        if shape is None or node.input[0] in constants:  # only reshapes of activations, not of weights
            continue
        values = numpy_helper.to_array(shape).copy()
        if values[0] == 1:
            values[0] = 0
            shape.CopyFrom(numpy_helper.from_array(values, shape.name))
    del graph.value_info[:]
    onnx.save(model, str(out))
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    frame = np.random.default_rng(0).random((1, 3, 640, 640), np.float32)
    both = session.run(None, {"images": np.concatenate([frame, frame])})[0]
    alone = session.run(None, {"images": frame})[0]
    if both.shape[0] != 2 or not all(np.allclose(b, alone[0], rtol=1e-4, atol=1e-3) for b in both):
        raise SystemExit(f"the dynamic-batch export does not reproduce single frames: {both.shape}")
    return out


def prepare(folder: Path) -> dict[str, Path]:
    """Install the fixed and the dynamic-batch bundle, each in its own state directory."""
    from agent.bundles.archive import build_bundle
    from agent.bundles.installer import InstallPolicy, install
    from agent.bundles.store import Store
    from agent.hardware.board import probe

    dynamic = dynamic_batch_export(MODEL, folder / "yolov8n_int8_640_dynamic.onnx")
    states = {}
    for name, model in (("fixed", MODEL), ("dynamic", dynamic)):
        bundle = folder / f"{name}.bundle"
        build_bundle([model], bundle, name=f"yolov8n-{name}", version="1.0.0")
        state = folder / f"state-{name}"
        deployment = install(bundle, Store(state), probe(), InstallPolicy(allow_unsigned=True))
        if deployment.state != "SUCCEEDED":
            raise SystemExit(f"installing {name}: {deployment.error}")
        states[name] = state
    return states


def run(name: str, states: dict[str, Path], quick: bool, baseline: Path | None) -> dict[str, Any]:
    cameras, fps, share, bundle, warm, measure = SCENARIOS[name]
    if quick:
        warm, measure = 8.0, 6.0
    old = name.endswith("baseline")  # the code before this change: no cameras section, a model per camera
    spec = {"state_dir": str(states[bundle]), "cameras": cameras, "fps": fps, "share": None if old else share}
    spec |= {"warm": warm, "measure": measure, "malloc_defaults": name.endswith("glibc defaults")}
    env = {**os.environ, "PYTHONPATH": str(baseline)} if old and baseline else None
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)],
        capture_output=True,
        text=True,
        cwd=baseline if old and baseline else REPO,
        timeout=600,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="8 s warm-up, 6 s measured: a smoke test, not numbers")
    parser.add_argument(
        "--only", nargs="+", choices=[*SCENARIOS, *BASELINE, *MALLOC_DEFAULTS], metavar="SCENARIO", help="these only"
    )
    parser.add_argument(
        "--baseline", type=Path, help="a checkout of the code before (git archive main | tar -x -C DIR): its RSS too"
    )
    args = parser.parse_args()
    if args.baseline:
        SCENARIOS.update(BASELINE)
    SCENARIOS.update({name: MALLOC_DEFAULTS[name] for name in args.only or () if name in MALLOC_DEFAULTS})
    if not MODEL.is_file():
        raise SystemExit(f"{MODEL} not found (set EDGE_AGENT_SHARED_MODELS)")
    scenarios = args.only or [*SCENARIOS]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in scenarios}
    with tempfile.TemporaryDirectory(prefix="bench-cameras-") as tmp:
        states = prepare(Path(tmp))
        for round_ in range(args.rounds):
            order = scenarios if round_ % 2 == 0 else scenarios[::-1]
            for name in order:
                results[name].append(run(name, states, args.quick, args.baseline))
                print(f"round {round_ + 1} {name}: {results[name][-1]}", file=sys.stderr, flush=True)
    if args.only:  # a subset: the raw results, no comparison
        print(json.dumps(results))
        return 0

    def median(name: str, key: str) -> float:
        return round(statistics.median(r[key] for r in results[name]), 2)

    def per_round(a: str, b: str, key: str, op: str) -> float:
        pairs = zip(results[a], results[b], strict=True)
        values = [x[key] - y[key] if op == "-" else x[key] / y[key] for x, y in pairs]
        return round(statistics.median(values), 3)

    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "rounds": args.rounds,
        "medians": {
            name: {key: median(name, key) for key in ("rss_mb", "fps", "frames_per_cpu_s", "cpu_share")}
            for name in SCENARIOS
        },
        "extra_rss_per_camera_mb": {
            "shared": round(per_round("rss 4 shared", "rss 1 shared", "rss_mb", "-") / 3, 1),
            "separate": round(per_round("rss 4 separate", "rss 1 shared", "rss_mb", "-") / 3, 1),
            **(
                {"baseline": round(per_round("rss 4 baseline", "rss 1 baseline", "rss_mb", "-") / 3, 1)}
                if args.baseline
                else {}
            ),
        },
        "fps_ratio_vs_separate": {
            "shared": per_round("fps 4 shared", "fps 4 separate", "fps", "/"),
            "shared batched": per_round("fps 4 shared batched", "fps 4 separate", "fps", "/"),
        },
        "frames_per_cpu_s_ratio_vs_separate": {
            "shared": per_round("fps 4 shared", "fps 4 separate", "frames_per_cpu_s", "/"),
            "shared batched": per_round("fps 4 shared batched", "fps 4 separate", "frames_per_cpu_s", "/"),
        },
        "load_average": [
            min(r["load"] for rs in results.values() for r in rs),
            max(r["load"] for rs in results.values() for r in rs),
        ],
        "mean_batch": statistics.median(r["mean_batch"][0] for r in results["fps 4 shared batched"]),
        "raw": results,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"machine: {report['machine']}, {args.rounds} rounds")
    print(f"  load average during the run: {report['load_average'][0]:.1f} to {report['load_average'][1]:.1f}")
    for name, values in report["medians"].items():
        print(
            f"  {name:<22} RSS {values['rss_mb']:7.1f} MB   FPS {values['fps']:6.2f}   "
            f"frames per CPU-second {values['frames_per_cpu_s']:5.2f}   CPU share {values['cpu_share']:4.2f}"
        )
    extra = report["extra_rss_per_camera_mb"]
    print(f"  extra RSS per camera: shared {extra['shared']} MB, a model each {extra['separate']} MB", end="")
    print(f", before this change {extra['baseline']} MB" if "baseline" in extra else "")
    ratio = report["fps_ratio_vs_separate"]
    print(f"  total FPS vs a model each: shared {ratio['shared']}x, shared batched {ratio['shared batched']}x")
    ratio = report["frames_per_cpu_s_ratio_vs_separate"]
    print(f"  frames per CPU-second vs a model each: shared {ratio['shared']}x, batched {ratio['shared batched']}x")
    print(f"  mean batch: {report['mean_batch']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
