#!/usr/bin/env python3
"""Regions against full frames (docs/cameras.md "Regions", issue 39 item 3): a camera's whole
gated pipeline (MJPG decode, the motion check, letterbox, inference, decoding) on a rendered
1080p clip of small people far away, once inferring whole frames and once crops around the
motion (`pipelines.regions`), side by side in one run.

Clips (MJPG .avi at 10 FPS, rendered into a temporary folder, `testkit.motion_clips`): the
textured still scene with scikit-image's astronaut photo pasted as people `--size` pixels square
(144: a person about 48 pixels tall once the frame is letterboxed into 640) walking across it,
`--people` of them, each for a third of the clip, starting a sixth of the clip apart.

The reference is the renderer's own boxes, at full resolution. Recall: the share of (frame,
person in view) pairs, over every frame the sinks get, with a person detection of score >= 0.5
overlapping the true box (IoU >= 0.3). CPU: the process's user + system seconds during the run,
per minute of video. Medians over the rounds (the order swapped every other round), and the
regions/full ratio of each round's CPU.

    python bench/region_recall.py [--model MODEL] [--seconds 20] [--rounds 3] [--people 1,3,6] [--size 144]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests" / "support")]

from testkit.motion_clips import MotionClip, Mover  # noqa: E402

from pipelines.decoding.detections import Detections  # noqa: E402
from pipelines.decoding.detector import Detector  # noqa: E402
from pipelines.decoding.nms import box_iou  # noqa: E402
from pipelines.gating import Gating  # noqa: E402
from pipelines.motion import MotionDetector  # noqa: E402
from pipelines.motion_gate import MotionGate  # noqa: E402
from pipelines.pipeline import Pipeline, use_one_opencv_thread  # noqa: E402
from pipelines.regions import RegionSchedule  # noqa: E402
from pipelines.sources.capture import FileSource  # noqa: E402
from pipelines.sources.frames import Frame  # noqa: E402
from runtimes.registry import load_runtime  # noqa: E402

FPS = 10.0
MODEL = REPO.parent / "shared" / "models" / "yolov8n_int8_640.onnx"
PERSON, SCORE, IOU = 0, 0.5, 0.3


def scene(people: int, frames: int, size: int) -> MotionClip:
    """`people` astronauts walking across a 1920x1080 still scene (see the module)."""
    from skimage import data

    picture = np.ascontiguousarray(data.astronaut()[..., ::-1])
    span, step = frames // 3, max(1, frames // 6)
    movers = []
    for i in range(people):
        start = (i * step) % max(1, frames - span)
        y = 1080 * (0.35 + 0.5 * ((i * 0.37) % 1.0))
        x0, x1 = (200.0, 1720.0) if i % 2 == 0 else (1720.0, 200.0)
        movers.append(Mover(((start, x0, y), (start + span, x1, y)), size=(size, size), picture=picture))
    return MotionClip(1920, 1080, seed=3, movers=tuple(movers), noise_sigma=2.0)


@dataclass(frozen=True)
class Run:
    cpu_s: float
    inferred: int
    crops: int  # crops inferred (0: full frames only)
    found: int  # (frame, person) pairs found
    people: int  # (frame, person) pairs in view


def run(model: Path, clip: Path, truth: MotionClip, regions: bool) -> Run:
    hits = [0, 0]

    def sink(frame: Frame, detections: Detections) -> None:
        people = detections[(detections.class_id == PERSON) & (detections.confidence >= SCORE)]
        for box in truth.boxes(frame.index):
            hits[1] += 1
            hits[0] += bool(len(people)) and bool((box_iou(box, people.xyxy) >= IOU).any())

    detector = Detector(load_runtime("onnxruntime", model))
    gating = Gating(MotionDetector(), MotionGate())
    schedule = RegionSchedule() if regions else None
    pipeline = Pipeline("bench", FileSource(clip), detector, sinks=[sink], gating=gating, regions=schedule)
    before = resource.getrusage(resource.RUSAGE_SELF)
    pipeline.start()
    pipeline.wait()
    after = resource.getrusage(resource.RUSAGE_SELF)
    pipeline.stop()
    detector.close()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Run(cpu, pipeline.inferred, schedule.crops if schedule else 0, hits[0], hits[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MODEL, help="an .onnx detector (default: the shared YOLOv8n)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of video per clip, at 10 FPS")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--people", default="1,3,6", help="clips: how many people walk in each")
    parser.add_argument("--size", type=int, default=144, help="a person's side in frame pixels")
    args = parser.parse_args()
    use_one_opencv_thread()
    frames = int(args.seconds * FPS)
    counts = [int(n) for n in args.people.split(",")]
    minutes = frames / FPS / 60
    head = f"{args.model.name}, 1920x1080, {args.seconds:g} s clips at {FPS:g} FPS, people {args.size} px"
    print(f"{head}, {args.rounds} rounds (medians)")
    columns = f"{'people':>6}{'inferred':>10}{'crops':>7}{'recall full':>13}{'regions':>9}"
    print(f"{columns}{'CPU s/min full':>16}{'regions':>9}{'ratio':>8}")
    with tempfile.TemporaryDirectory(prefix="region-recall-") as tmp:
        for people in counts:
            truth = scene(people, frames, args.size)
            clip = Path(tmp) / f"far-{people}.avi"
            writer = cv2.VideoWriter(str(clip), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (1920, 1080))
            texture = truth.texture()
            for index in range(frames):
                writer.write(truth.frame(index, texture))
            writer.release()
            pairs: list[tuple[Run, Run]] = []
            for n in range(args.rounds):
                if n % 2:
                    cropped, full = run(args.model, clip, truth, True), run(args.model, clip, truth, False)
                else:
                    full, cropped = run(args.model, clip, truth, False), run(args.model, clip, truth, True)
                pairs.append((full, cropped))
            full_cpu = statistics.median(f.cpu_s for f, _ in pairs) / minutes
            crop_cpu = statistics.median(c.cpu_s for _, c in pairs) / minutes
            ratio = statistics.median(c.cpu_s / f.cpu_s for f, c in pairs)
            full_recall = statistics.median(f.found / max(1, f.people) for f, _ in pairs)
            crop_recall = statistics.median(c.found / max(1, c.people) for _, c in pairs)
            inferred = statistics.median(c.inferred for _, c in pairs)
            crops = statistics.median(c.crops for _, c in pairs)
            print(
                f"{people:>6}{inferred:>6g}/{frames:<3}{crops:>7g}{full_recall:>13.3f}{crop_recall:>9.3f}"
                f"{full_cpu:>16.1f}{crop_cpu:>9.1f}{ratio:>8.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
