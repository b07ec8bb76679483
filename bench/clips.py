#!/usr/bin/env python3
"""The clips' ring buffer at 720p (docs/benchmarks.md#clip-ring-buffer): what one camera's ring
holds in memory and what buffering costs its inference thread per frame.

A real `agent.daemon.clips.ClipRecorder` is fed `--seconds` of a 1280x720 `SyntheticScene` at
`--fps` (moving shapes on a textured ground, with sensor-like pixel noise `--noise`; 0 gives a
clean, easy to compress picture), one camera with ``clips: {pre_s, post_s, quality}``; an event
starts a clip every `--every` seconds (the writer thread is not started: this measures the
camera side only). Reported: JPEG bytes per frame (median), the ring's bytes once full
(``stats().buffered_bytes``), the Python heap the recorder holds (tracemalloc), the time
`frame` takes per frame (median, p95: the JPEG encode), and the same for writing one clip with
OpenCV (`write_clip`: decode and encode ``pre_s + post_s`` of frames).

    .venv/bin/python bench/clips.py [--seconds 12] [--fps 15] [--pre 3] [--post 5] [--quality 70] [--noise 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.config.models import CameraSection, ClipSection  # noqa: E402
from agent.daemon.clips import Clip, ClipRecorder, write_clip  # noqa: E402
from pipelines.sources.frames import Frame  # noqa: E402
from pipelines.sources.synthetic import SyntheticScene  # noqa: E402

MIB = 1024 * 1024


def measure(args: argparse.Namespace) -> dict[str, Any]:
    scene = SyntheticScene(1280, 720, num_shapes=6, seed=1, noise=args.noise)
    count = round(args.seconds * args.fps)
    images = [scene.render(i)[0] for i in range(count)]
    clips = ClipSection(pre_s=args.pre, post_s=args.post, quality=args.quality, buffer_mb=args.buffer_mb)
    section = CameraSection(name="cam0", source="synthetic", fps=args.fps, clips=clips)
    folder = Path(tempfile.mkdtemp(prefix="clips-bench-"))
    recorder = ClipRecorder([section], folder, lambda event, path: None)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    times, every = [], max(1, round(args.every * args.fps))
    for i, image in enumerate(images):
        start = time.perf_counter()
        recorder.frame("cam0", Frame(i, i / args.fps, image))
        if i % every == every - 1:
            recorder.trigger("cam0", f"{i:016x}")
        times.append(time.perf_counter() - start)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    ring = recorder.stats().buffered_bytes
    frames_in_ring = round(args.pre * args.fps) + 1
    queued = recorder._queue.get_nowait()  # a finished clip, to time the writer on
    assert queued is not None
    start = time.perf_counter()
    written = write_clip(Clip(queued.event_id, queued.frames, queued.fps), folder)
    write_s = time.perf_counter() - start
    per_frame = ring / frames_in_ring
    return {
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "settings": vars(args),
        "jpeg_bytes_per_frame": round(per_frame),
        "ring_frames": frames_in_ring,
        "ring_mib": round(ring / MIB, 2),
        "heap_held_mib": round(held / MIB, 2),
        "frame_ms_median": round(statistics.median(times) * 1000, 2),
        "frame_ms_p95": round(sorted(times)[int(len(times) * 0.95)] * 1000, 2),
        "clip_frames": len(queued.frames),
        "clip_write_s": round(write_s, 2),
        "clip_file_mib": round(written.stat().st_size / MIB, 2) if written else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--fps", type=float, default=15.0)
    parser.add_argument("--pre", type=float, default=3.0)
    parser.add_argument("--post", type=float, default=5.0)
    parser.add_argument("--quality", type=int, default=70)
    parser.add_argument("--noise", type=float, default=4.0)
    parser.add_argument("--every", type=float, default=6.0, help="seconds between object starts")
    parser.add_argument("--buffer-mb", type=float, default=16.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
