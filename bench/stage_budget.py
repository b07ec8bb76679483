#!/usr/bin/env python3
"""Core budgets stage by stage: what each step of one camera's frame costs on one core and on two,
at 1280x720 and 1920x1080, side by side in one run (docs/benchmarks.md, "Core budgets").

The clip is scikit-image's photos (a person, a cat, a cup, a motorcycle) sliding across a grey
frame, written once per resolution as MJPG, so that YOLOv8n finds objects that move: the
tracker, the counting line and the zone have work and object events start and end. Each
scenario runs in a child process pinned to its cores (``os.sched_setaffinity``, what
``taskset -c`` does, before any runtime starts), the scenarios in a rotated order each round.
The child runs the daemon's per-frame work on every frame in turn, in one thread, with the
daemon's own components:

============ =====================================================================================
capture      `FileSource.read`: the clip's frame decoded and converted to BGR by OpenCV (a camera's
             pipe source instead reads decoded frames that ffmpeg or GStreamer made)
preprocess   `Detector.prepare`: letterbox, colour order, the uint8 tensor
inference    `Detector.infer`: normalisation and the model (the runtime's own threads included)
decode       `Detector.postprocess`: decoding, NMS, boxes back to the frame
tracking     `SceneAnalytics.update` inside `EventSink.handle`: ByteTrack, one line, one zone
events       the rest of `EventSink.handle`: the object events, each with its JSON and its write
             into the outbox (sqlite) as the daemon's `Outgoing.event`, end events with their crop
page_frame   what `Pipeline.snapshot` does for the page: boxes drawn, JPEG encoded (per request:
             an open page asks once a second)
clip_ring    `ClipRecorder.frame`: the frame JPEG-encoded into the camera's ring (opt-in ``clips``)
============ =====================================================================================

Each stage's wall time and CPU time in ms per frame (the stage's thread; inference's: every
thread's, the runtime's own too), medians over the frames after a warm-up; `between_calls` is
the CPU the process used outside every stage (ONNX Runtime's threads spin-waiting). The CPU ms
is what a stage takes out of the board's cores, the wall ms what it adds to a frame's latency.

    .venv/bin/python bench/yolov8n_fp32.py     # build/bench/yolov8n_640.onnx
    .venv/bin/python bench/stage_budget.py [--model M] [--cores 0 0,1] [--frames 90] [--rounds 2] [--json]
    .venv/bin/python bench/stage_budget.py --set spinning=false     # ONNX Runtime's threads sleep when idle
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STAGES = ("capture", "preprocess", "inference", "decode", "tracking", "events", "page_frame", "clip_ring")
#: scikit-image photos with COCO objects (a person, a cat, a cup, a motorcycle)
PHOTOS = ("astronaut", "chelsea", "coffee", "stereo_motorcycle")

CHILD = r"""
import json, os, statistics, sys, tempfile, time
from dataclasses import replace
from pathlib import Path

spec = json.loads(sys.argv[1])
os.sched_setaffinity(0, spec["cores"])  # before any library starts its threads

from agent.config.models import EventsSection, MediaSection, OutboxSection, CameraSection
from agent.daemon.clips import ClipRecorder
from agent.daemon.media import MediaStore
from agent.mqtt.outbox import Outbox
from agent.mqtt.protocol import Topics, json_payload
from agent.serving.events import EventSink
from agent.serving.loader import load_model
from pipelines.annotate import BoxAnnotator, encode_jpeg
from pipelines.decoding.detector import Detector
from pipelines.pipeline import use_one_opencv_thread
from pipelines.sources.capture import FileSource
from runtimes.base import compact_malloc

compact_malloc()  # as the daemon does
use_one_opencv_thread()
width, height = spec["size"]
state = Path(tempfile.mkdtemp(prefix="stage-budget-"))
section = CameraSection.model_validate({
    "name": "cam0", "source": spec["clip"], "clips": {},
    "lines": [{"name": "door", "points": [[width // 2, 0], [width // 2, height]]}],
    "zones": [{"name": "left", "polygon": [[0, 0], [width // 2, 0], [width // 2, height], [0, height]]}],
})
if spec["settings"]:  # the runtime's agent.yaml section, as --set gave it
    from runtimes.registry import backend, load_runtime
    config = backend(spec["runtime"]).config.model_validate(spec["settings"])
    runtime, served = load_runtime(spec["runtime"], Path(spec["model"]), config), spec["runtime"]
else:
    runtime, choice = load_model(Path(spec["model"]), spec["runtime"])
    served = choice.runtime
detector = Detector(runtime)
names = runtime.metadata.names or {}
labels = [names.get(i, str(i)) for i in range(max(names, default=-1) + 1)]
outbox = Outbox(state / "outbox.sqlite", OutboxSection())
media = MediaStore(state / "media", MediaSection())
topic = Topics().events("bench")
events_made = []

def publish(event):  # what Outgoing.event does with an object event (no clips, no broker)
    if event.snapshot_jpeg is not None and (name := media.put(event.object_id, event.snapshot_jpeg)) is not None:
        event = replace(event, snapshot_jpeg=None, snapshot=name)
    outbox.append("event", topic, json_payload({"device": "bench", **event.to_json()}))
    events_made.append(event.kind)

sink = EventSink(EventsSection(snapshots=True), lambda: labels, publish, [section])
scene = sink.scene("cam0")
clips = ClipRecorder([section], state / "clips", lambda event_id, path: None)
annotator = BoxAnnotator(sink.label)
source = FileSource(Path(spec["clip"]))
source.open()

tracking_ms = []
update = scene.update
def timed_update(frame, detections):
    start = time.perf_counter()
    try:
        return update(frame, detections)
    finally:
        tracking_ms.append((time.perf_counter() - start) * 1000)
scene.update = timed_update

samples = {stage: ([], []) for stage in (*spec["stages"], "between_calls")}
def timed(stage, call, *args):
    # the stage's own thread's CPU; inference's: every thread's (the runtime's own threads)
    cpu_clock = time.process_time if stage == "inference" else time.thread_time
    wall, cpu = time.perf_counter(), cpu_clock()
    result = call(*args)
    samples[stage][0].append((time.perf_counter() - wall) * 1000)
    samples[stage][1].append((cpu_clock() - cpu) * 1000)
    return result

objects = 0
for i in range(spec["frames"]):
    frame_cpu = time.process_time()
    frame = timed("capture", source.read)
    if frame is None:
        raise SystemExit(f"the clip ended at frame {i}")
    tensor, transform = timed("preprocess", detector.prepare, frame.image)
    outputs = timed("inference", detector.infer, tensor)
    detections = timed("decode", detector.postprocess, outputs, transform)
    timed("events", sink.handle, "cam0", frame, detections)
    # handle = tracking + events: the tracker's share is split off by its own wall time, and the
    # CPU in the same proportion (one thread, no waits: wall and CPU move together there)
    walls, cpus = samples["events"]
    share = tracking_ms[-1] / walls[-1] if walls[-1] > 0 else 0.0
    samples["tracking"][0].append(tracking_ms[-1]); samples["tracking"][1].append(cpus[-1] * share)
    walls[-1] -= tracking_ms[-1]; cpus[-1] -= cpus[-1] * share
    timed("page_frame", lambda: encode_jpeg(annotator.annotate(frame.image, detections), 85))
    timed("clip_ring", clips.frame, "cam0", frame)
    objects += len(detections)
    # what the process's other threads took outside inference (ONNX Runtime's spin-waiting)
    frame_cpu_ms = (time.process_time() - frame_cpu) * 1000
    samples["between_calls"][0].append(0.0)
    in_stages = sum(cpu_ms[-1] for stage, (_, cpu_ms) in samples.items() if stage != "between_calls")
    samples["between_calls"][1].append(frame_cpu_ms - in_stages)

warm = spec["warmup"]
medians = {  # events come on a few frames only: their mean says what they cost over a minute
    stage: {"wall_ms": round(statistics.median(w[warm:]), 3), "cpu_ms": round(statistics.median(c[warm:]), 3),
            "cpu_mean_ms": round(statistics.fmean(c[warm:]), 3)}
    for stage, (w, c) in samples.items()
}
kinds = {k: events_made.count(k) for k in ("start", "update", "end")}
masks = sorted({  # the CPUs each thread may run on: the runtime's threads must stay inside the set
    line.split()[1] for task in Path("/proc/self/task").iterdir()
    for line in (task / "status").read_text().splitlines() if line.startswith("Cpus_allowed_list:")
})
print(json.dumps({
    "cores": spec["cores"], "size": spec["size"], "runtime": served, "thread_cpu_lists": masks,
    "config": runtime.config.model_dump(mode="json") if hasattr(runtime, "config") else None,
    "stages": medians, "objects_per_frame": round(objects / spec["frames"], 2), "events": kinds,
    "line_crossings": sum(l.forward + l.backward for c in sink.counts() for l in c.lines),
}))
"""


def write_clip(path: Path, size: tuple[int, int], frames: int) -> Path:
    """`frames` frames of `size` (width, height): the `PHOTOS` each sliding across a grey frame
    on its own row and speed, entering and leaving it (so tracks start, cross the middle, end)."""
    import cv2
    import numpy as np
    from skimage import data

    width, height = size
    rng = np.random.default_rng(0)
    photos = []
    for name in PHOTOS:
        image = getattr(data, name)()
        image = image[0] if isinstance(image, tuple) else image  # stereo_motorcycle: (left, right, disparity)
        image = np.stack([image] * 3, axis=-1) if image.ndim == 2 else image[..., :3]
        scale = height * 0.42 / image.shape[0]
        photos.append(cv2.resize(np.ascontiguousarray(image[..., ::-1]), None, fx=scale, fy=scale))
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 15.0, size)
    background = np.full((height, width, 3), 110, np.uint8)
    background += rng.integers(0, 12, background.shape, dtype=np.uint8)
    for t in range(frames):
        canvas = background.copy()
        for k, photo in enumerate(photos):
            h, w = photo.shape[:2]
            travel = width + w
            x = int((t * (0.8 + 0.3 * k) / frames * travel + k * travel / len(photos)) % travel) - w
            y = int((k % 2) * (height - h))
            left, right = max(0, x), min(width, x + w)
            if right > left:
                canvas[y : y + h, left:right] = photo[:, left - x : right - x]
        writer.write(canvas)
    writer.release()
    return path


def text_row(row: dict[str, Any]) -> str:
    """One scenario as a line: each stage's median wall / CPU ms a frame (events: the mean CPU,
    since they come on few frames), what the objects and events were."""
    stages = row["stages"]
    cells = [f"{s} {stages[s]['wall_ms']:.1f}/{stages[s]['cpu_ms']:.1f}" for s in STAGES if s != "events"]
    cells.append(f"events mean {stages['events']['cpu_mean_ms']:.2f}")
    cells.append(f"between_calls {stages['between_calls']['cpu_ms']:.1f}")
    size = "x".join(str(v) for v in row["size"])
    cores = ",".join(str(c) for c in row["cores"])
    return (
        f"round {row['round']} cores {cores} {size} (wall/CPU ms): {'  '.join(cells)}; "
        f"{row['objects_per_frame']} objects a frame, events {row['events']}, "
        f"threads on CPUs {row['thread_cpu_lists']}"
    )


def parse_settings(pairs: list[str], runtime: str) -> dict[str, Any]:
    """`--set` pairs as the runtime's settings (values read as YAML: false, 2, "a"), checked by
    its config model here so that a bad key or value is named before any scenario runs."""
    import yaml
    from pydantic import ValidationError

    from runtimes.registry import RuntimeUnavailable, backend

    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE, e.g. spinning=false")
        settings[key] = yaml.safe_load(value)
    if settings:
        try:
            backend(runtime).config.model_validate(settings)  # type: ignore[arg-type]
        except (RuntimeUnavailable, ValidationError) as exc:
            raise SystemExit(f"--set: runtimes.{runtime} refuses {settings}: {exc}") from None
    return settings


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env, timeout=900
    )
    if proc.returncode != 0:
        raise SystemExit(f"the scenario {spec['cores']} {spec['size']} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=REPO / "build" / "bench" / "yolov8n_640.onnx")
    parser.add_argument("--runtime", default="onnxruntime")
    parser.add_argument("--cores", nargs="+", default=["0", "0,1"], help="CPU sets, as taskset -c takes them")
    parser.add_argument("--sizes", nargs="+", default=["1280x720", "1920x1080"])
    parser.add_argument("--frames", type=int, default=90, help="frames per scenario: the clip's length")
    parser.add_argument("--warmup", type=int, default=5, help="first frames left out of the medians")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a setting of the runtime's agent.yaml section (runtimes.<runtime>), e.g. spinning=false",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = parse_settings(args.set, args.runtime)
    if not args.model.is_file():
        raise SystemExit(f"model not found: {args.model} (bench/yolov8n_fp32.py makes it)")
    if args.frames <= args.warmup:
        raise SystemExit(f"--frames ({args.frames}) must be more than --warmup ({args.warmup})")
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes]
    cores = [[int(c) for c in group.split(",")] for group in args.cores]
    missing = sorted({c for group in cores for c in group} - os.sched_getaffinity(0))
    if missing:
        raise SystemExit(f"--cores names CPUs this process may not use: {missing}")
    folder = Path(tempfile.mkdtemp(prefix="stage-budget-clips-"))
    clips = {size: write_clip(folder / f"clip{size[0]}x{size[1]}.avi", size, args.frames) for size in sizes}  # type: ignore[arg-type]
    scenarios = [(c, s) for c in cores for s in sizes]
    rows: list[dict[str, Any]] = []
    for r in range(args.rounds):
        shift = r % len(scenarios)
        for group, size in scenarios[shift:] + scenarios[:shift]:
            spec = {
                "cores": group, "size": size, "clip": str(clips[size]), "model": str(args.model),  # type: ignore[index]
                "runtime": args.runtime, "settings": settings, "frames": args.frames, "warmup": args.warmup,
                "stages": STAGES,
            }  # fmt: skip
            row = {"round": r + 1, **run_child(spec)}
            rows.append(row)
            if not args.json:
                print(text_row(row), flush=True)
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "load": os.getloadavg()}
    if args.json:
        print(json.dumps({"model": str(args.model), "machine": machine, "rows": rows}))


if __name__ == "__main__":
    main()
