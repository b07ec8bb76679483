#!/usr/bin/env python3
"""Copy times of the TensorRT backend's device-memory seam on a real GPU (cuda-python).

For a YOLO input (1x3x640x640 float32, 4.9 MB) and output (1x84x8400 float32, 2.8 MB): one copy
in and one copy out on a stream, then a stream sync, as the backend does per frame; from pinned
host buffers (what the backend uses) and, for comparison, from ordinary (pageable) numpy arrays.
Prints one JSON object: GPU, CUDA versions, median and p95 in ms, and GB/s.

    python bench/cuda_memory.py [--runs 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from runtimes.cuda_memory import CudaPythonMemory


def measure(memory: CudaPythonMemory, runs: int, pinned: bool) -> dict[str, float]:
    shapes = ((1, 3, 640, 640), (1, 84, 8400))
    stream = memory.stream()
    buffers = [memory.alloc(int(np.prod(s)) * 4) for s in shapes]
    allocate = memory.pinned if pinned else np.empty
    hosts = [allocate(s, np.float32) for s in shapes]
    hosts[0][...] = 0.5
    times = []
    for _ in range(runs + 10):
        start = time.perf_counter()
        memory.to_device(buffers[0], hosts[0], stream)
        memory.to_host(hosts[1], buffers[1], stream)
        memory.synchronize(stream)
        times.append((time.perf_counter() - start) * 1000)
    times = sorted(times[10:])
    for buffer in buffers:
        memory.free(buffer)
    if pinned:
        for host in hosts:
            memory.free_pinned(host)
    memory.close_stream(stream)
    median = statistics.median(times)
    nbytes = sum(int(np.prod(s)) * 4 for s in shapes)
    return {
        "median_ms": round(median, 3),
        "p95_ms": round(times[int(len(times) * 0.95)], 3),
        "gb_s": round(nbytes / median / 1e6, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    memory = CudaPythonMemory()
    info = memory.info()
    runtime, driver = memory.versions()
    report = {
        "gpu": info.name,
        "compute_capability": list(info.compute_capability),
        "cuda_runtime": runtime,
        "cuda_driver": driver,
        "runs": args.runs,
        "pinned": measure(memory, args.runs, pinned=True),
        "pageable": measure(memory, args.runs, pinned=False),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
