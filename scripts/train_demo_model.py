#!/usr/bin/env python3
"""Train the demo detector (scripts/demo_model.py) on frames of the synthetic scene.

Frames come from random scenes (seeds below 100000; evaluation uses 100000 and up), rendered
at several frame sizes and letterboxed with the same preprocessing the agent uses at run time.

    python scripts/train_demo_model.py --out build/demo/demo_detector.pt            # CPU, ~1 h
    python scripts/train_demo_model.py --device cuda --workers 12 --out ...          # GPU, minutes

Needs the ``train`` extra (PyTorch).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from demo_model import DemoDetector, loss
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from pipelines.decoding.preprocess import PreprocessConfig, preprocess
from pipelines.sources.synthetic import CLASS_NAMES, SyntheticScene

REPO = Path(__file__).resolve().parent.parent

FRAME_SIZES = ((640, 480), (640, 360), (800, 600), (480, 480), (1280, 720), (320, 240))
TRAIN_SEEDS = 100_000
#: training keeps shapes at least this visible as targets; the evaluation ignores the rest
MIN_VISIBLE = 0.3


def random_scene(rng: np.random.Generator) -> SyntheticScene:
    width, height = FRAME_SIZES[rng.integers(len(FRAME_SIZES))]
    short = min(width, height)
    return SyntheticScene(
        width=width,
        height=height,
        num_shapes=int(rng.integers(1, 9)),
        seed=int(rng.integers(TRAIN_SEEDS)),
        size_range=(short * 0.08, short * 0.32),
        noise=float(rng.uniform(0, 8)),
    )


class SceneFrames(IterableDataset):  # type: ignore[type-arg]
    """Endless (image tensor (3, S, S), boxes (k, 4) in input pixels, classes (k,)) samples."""

    def __init__(self, input_size: int, seed: int) -> None:
        self.config = PreprocessConfig(size=(input_size, input_size))
        self.seed = seed

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        info = get_worker_info()
        rng = np.random.default_rng((self.seed, info.id if info else 0))
        scenes = [random_scene(rng) for _ in range(8)]
        while True:
            slot = int(rng.integers(len(scenes)))
            if rng.random() < 0.05:
                scenes[slot] = random_scene(rng)
            image, truth = scenes[slot].render(int(rng.integers(100_000)))
            tensor, transform = preprocess(image, self.config)
            keep = truth.visible >= MIN_VISIBLE
            boxes = truth.detections.xyxy[keep].copy()
            boxes[:, [0, 2]] = boxes[:, [0, 2]] * transform.scale_x + transform.pad_x
            boxes[:, [1, 3]] = boxes[:, [1, 3]] * transform.scale_y + transform.pad_y
            yield tensor[0], boxes, truth.detections.class_id[keep].astype(np.int64)


def _one_thread(_: int) -> None:
    """Each data worker uses one thread: many workers x many OpenCV/torch threads thrash the CPU."""
    import cv2

    cv2.setNumThreads(1)
    torch.set_num_threads(1)


def save(model: torch.nn.Module, path: Path, input_size: int, steps: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {"state_dict": model.state_dict(), "input_size": input_size, "names": list(CLASS_NAMES), "steps": steps}, path
    )


def collate(
    batch: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    images = torch.from_numpy(np.stack([b[0] for b in batch]))
    return images, [(torch.from_numpy(b[1]), torch.from_numpy(b[2])) for b in batch]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where to write the weights (.pt)")
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--input-size", type=int, default=320)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop-after", type=int, help="stop after this many steps (the schedule still spans --steps)")
    parser.add_argument("--init", type=Path, help="start from these weights (a .pt this script wrote)")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    model = DemoDetector(num_classes=len(CLASS_NAMES))
    if args.init:
        model.load_state_dict(torch.load(args.init, map_location="cpu", weights_only=True)["state_dict"])
    model = model.to(device)
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.998), use_buffers=True
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
    warmup = min(300, args.steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: (
            (step + 1) / warmup
            if step < warmup
            else 0.5 * (1 + math.cos(math.pi * (step - warmup) / (args.steps - warmup)))
        ),
    )
    loader = DataLoader(
        SceneFrames(args.input_size, args.seed),
        batch_size=args.batch,
        num_workers=args.workers,
        collate_fn=collate,
        persistent_workers=args.workers > 0,
        worker_init_fn=_one_thread,
    )
    start = time.time()
    model.train()
    for step, (images, targets) in enumerate(loader):
        if step >= (args.stop_after or args.steps):
            break
        images = images.to(device, non_blocking=True)
        targets = [(b.to(device), c.to(device)) for b, c in targets]
        total, parts = loss(model, images, targets)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        schedule.step()
        ema.update_parameters(model)
        if step % 500 == 499:
            save(ema.module, args.out, args.input_size, step + 1)  # a run cut short still leaves weights
        if step % 100 == 0 or step == args.steps - 1:
            print(
                f"step {step:5d}  loss {total.item():.3f}  cls {parts['cls']:.3f}  box {parts['box']:.3f}  "
                f"pos/img {parts['positives']:.1f}  lr {schedule.get_last_lr()[0]:.2e}  {time.time() - start:.0f}s",
                flush=True,
            )
    save(ema.module, args.out, args.input_size, args.steps)
    print(f"wrote {args.out} after {time.time() - start:.0f}s")


if __name__ == "__main__":
    main()
