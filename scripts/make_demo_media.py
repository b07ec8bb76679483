#!/usr/bin/env python3
"""Write a synthetic-scene still (scene.png) and clip (scene.mp4) for the demo and benchmarks.

python scripts/make_demo_media.py OUT_DIR [--frames 150] [--size 1280x720] [--seed 7] [--stills N]

`--stills N` also writes N stills of other scenes into OUT_DIR/calibration/ and N more (disjoint
seeds) into OUT_DIR/validation/, for `bundle build --precisions` (docs/optimising.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import cv2

from pipelines.sources.synthetic import SyntheticScene


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--size", default="640x480", help="WIDTHxHEIGHT")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--stills", type=int, default=0, help="calibration and validation stills (each)")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    short = min(width, height)
    scene = SyntheticScene(width, height, num_shapes=6, seed=args.seed, size_range=(short * 0.08, short * 0.3))
    args.out.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(args.out / "scene.png"), scene.render(0)[0])
    writer = cv2.VideoWriter(str(args.out / "scene.mp4"), cv2.VideoWriter.fourcc(*"mp4v"), 30.0, (width, height))
    if not writer.isOpened():
        sys.exit("this OpenCV build cannot write mp4v video")
    for i in range(args.frames):
        writer.write(scene.render(i)[0])
    writer.release()
    print(f"wrote {args.out / 'scene.png'} and {args.out / 'scene.mp4'} ({args.frames} frames, {width}x{height})")
    for folder, first_seed in (("calibration", 50_000), ("validation", 60_000)):
        if args.stills:
            (args.out / folder).mkdir(exist_ok=True)
        for i in range(args.stills):
            still = SyntheticScene(width, height, num_shapes=5, seed=first_seed + i).render(i * 13)[0]
            cv2.imwrite(str(args.out / folder / f"{i:03d}.png"), still)
    if args.stills:
        print(f"wrote {args.stills} stills each to {args.out / 'calibration'} and {args.out / 'validation'}")


if __name__ == "__main__":
    main()
