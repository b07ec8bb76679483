#!/usr/bin/env python3
"""Train the small task models (scripts/task_models.py) on frames of the synthetic scene.

The scene's ground truth gives each task its labels for free: the visible pixels of every shape
(segment), a triangle's three vertices with their visibility (pose: triangles only), every
shape's rotated box (obb), and crops of single shapes (classify). Frames come from random scenes
(seeds below 100000, as scripts/train_demo_model.py), letterboxed as the agent does at run time.

    python scripts/train_task_models.py --task segment --out build/task/segment.pt   # CPU: slow
    python scripts/train_task_models.py --task obb --device cuda --workers 4 --max-seconds 330 --out ...

The learning-rate schedule runs over --steps or --max-seconds, whichever ends first. Needs the
``train`` extra (PyTorch).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from task_models import CropClassifier, TaskModel, loss
from torch.utils.data import DataLoader, IterableDataset, get_worker_info
from train_demo_model import MIN_VISIBLE, random_scene

from pipelines.decoding.preprocess import PreprocessConfig, preprocess
from pipelines.sources.synthetic import CLASS_NAMES

#: the classes each task's model learns (pose: the triangle, whose vertices are its keypoints)
TASK_NAMES = {"segment": CLASS_NAMES, "pose": ("triangle",), "obb": CLASS_NAMES, "classify": CLASS_NAMES}
INPUT_SIZES = {"segment": 320, "pose": 320, "obb": 320, "classify": 64}


def _letterbox_masks(masks: np.ndarray, transform: Any, size: int) -> np.ndarray:
    """``(k, H, W)`` bool frame masks -> ``(k, size/4, size/4)`` float32 on the letterboxed input."""
    out = np.zeros((len(masks), size // 4, size // 4), np.float32)
    for i, mask in enumerate(masks):
        h, w = mask.shape
        new_w, new_h = round(w * transform.scale_x), round(h * transform.scale_y)
        canvas = np.zeros((size, size), np.float32)
        x0, y0 = round(transform.pad_x), round(transform.pad_y)
        resized = cv2.resize(mask.astype(np.float32), (new_w, new_h), interpolation=cv2.INTER_AREA)
        canvas[y0 : y0 + new_h, x0 : x0 + new_w] = resized[: size - y0, : size - x0]
        out[i] = cv2.resize(canvas, (size // 4, size // 4), interpolation=cv2.INTER_AREA) > 0.5
    return out


class TaskFrames(IterableDataset):  # type: ignore[type-arg]
    """Endless (image tensor (3, S, S), targets) samples for one detection task."""

    def __init__(self, task: str, input_size: int, seed: int) -> None:
        self.task, self.size, self.seed = task, input_size, seed
        self.config = PreprocessConfig(size=(input_size, input_size))

    def __iter__(self) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        info = get_worker_info()
        rng = np.random.default_rng((self.seed, info.id if info else 0))
        scenes = [random_scene(rng) for _ in range(8)]
        while True:
            slot = int(rng.integers(len(scenes)))
            if rng.random() < 0.05:
                scenes[slot] = random_scene(rng)
            image, truth = scenes[slot].render(int(rng.integers(100_000)), masks=self.task == "segment")
            tensor, tf = preprocess(image, self.config)
            keep = truth.visible >= MIN_VISIBLE
            classes = truth.detections.class_id
            if self.task == "pose":
                keep &= classes == 2
            assert truth.obb is not None and truth.keypoints is not None
            xyxy = truth.detections.xyxy[keep].copy()
            xyxy[:, [0, 2]] = xyxy[:, [0, 2]] * tf.scale_x + tf.pad_x
            xyxy[:, [1, 3]] = xyxy[:, [1, 3]] * tf.scale_y + tf.pad_y
            obb = truth.obb[keep].copy()
            obb[:, 0], obb[:, 1] = obb[:, 0] * tf.scale_x + tf.pad_x, obb[:, 1] * tf.scale_y + tf.pad_y
            obb[:, 2:4] *= tf.scale_x  # letterbox scales both axes alike
            kpts = truth.keypoints[keep].copy()
            kpts[..., 0] = kpts[..., 0] * tf.scale_x + tf.pad_x
            kpts[..., 1] = kpts[..., 1] * tf.scale_y + tf.pad_y
            target = {
                "xyxy": xyxy,
                "classes": np.zeros(int(keep.sum()), np.int64)
                if self.task == "pose"
                else classes[keep].astype(np.int64),
                "obb": obb,
                "keypoints": kpts,
            }
            if truth.masks is not None:
                target["masks"] = _letterbox_masks(truth.masks[keep], tf, self.size)
            yield tensor[0], target


def crop_input(image: np.ndarray, box: np.ndarray, size: int) -> np.ndarray:
    """A crop of BGR `image` at xyxy `box`, preprocessed as Ultralytics' classifier: shortest side
    resized to `size`, centre crop, RGB /255, ``(3, size, size)`` float32."""
    x1, y1, x2, y2 = (round(float(v)) for v in box)
    crop = image[max(y1, 0) : y2, max(x1, 0) : x2]
    h, w = crop.shape[:2]
    r = size / min(h, w)
    resized = cv2.resize(crop, (max(size, round(w * r)), max(size, round(h * r))), interpolation=cv2.INTER_LINEAR)
    top, left = (resized.shape[0] - size) // 2, (resized.shape[1] - size) // 2
    rgb = resized[top : top + size, left : left + size, ::-1]
    return np.ascontiguousarray(rgb.transpose(2, 0, 1), np.float32) / 255.0


class CropFrames(IterableDataset):  # type: ignore[type-arg]
    """Endless (crop tensor (3, S, S), class) samples: one shape each, with a random margin."""

    def __init__(self, input_size: int, seed: int) -> None:
        self.size, self.seed = input_size, seed

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        info = get_worker_info()
        rng = np.random.default_rng((self.seed, info.id if info else 0))
        scenes = [random_scene(rng) for _ in range(8)]
        while True:
            slot = int(rng.integers(len(scenes)))
            if rng.random() < 0.05:
                scenes[slot] = random_scene(rng)
            image, truth = scenes[slot].render(int(rng.integers(100_000)))
            height, width = image.shape[:2]
            for i in np.flatnonzero(truth.visible >= 0.6):
                x1, y1, x2, y2 = truth.detections.xyxy[i]
                mx, my = (x2 - x1) * rng.uniform(0.0, 0.4), (y2 - y1) * rng.uniform(0.0, 0.4)
                jitter = rng.uniform(-0.1, 0.1, 2) * [x2 - x1, y2 - y1]
                box = np.array([x1 - mx + jitter[0], y1 - my + jitter[1], x2 + mx + jitter[0], y2 + my + jitter[1]])
                box = np.clip(box, 0, [width, height, width, height])
                if box[2] - box[0] >= 8 and box[3] - box[1] >= 8:
                    yield crop_input(image, box, self.size), int(truth.detections.class_id[i])


def collate(
    batch: list[tuple[np.ndarray, dict[str, np.ndarray]]],
) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    images = torch.from_numpy(np.stack([b[0] for b in batch]))
    return images, [{k: torch.from_numpy(v) for k, v in b[1].items()} for b in batch]


def _one_thread(_: int) -> None:
    cv2.setNumThreads(1)
    torch.set_num_threads(1)


def save(model: torch.nn.Module, path: Path, task: str, input_size: int, steps: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"state_dict": model.state_dict(), "task": task, "input_size": input_size, "steps": steps}
    torch.save({**state, "names": list(TASK_NAMES[task])}, path)


def recalibrate(model: torch.nn.Module, loader: DataLoader, device: torch.device, batches: int) -> None:  # type: ignore[type-arg]
    """Re-estimate every BatchNorm's running statistics on `batches` training batches (a plain
    average over them): the averaged (EMA) weights need statistics of their own, and the ones
    averaged along with the weights gave scores near zero in evaluation mode."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    model.train()
    with torch.no_grad():
        for step, (images, _) in enumerate(loader):
            if step >= batches:
                break
            images = images.to(device)
            model(images) if isinstance(model, CropClassifier) else model.features(images)  # type: ignore[operator]
    for norm in norms:
        norm.momentum = 0.1
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASK_NAMES), required=True)
    parser.add_argument("--out", type=Path, required=True, help="where to write the weights (.pt)")
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--max-seconds", type=float, default=math.inf, help="stop (and end the schedule) by then")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", type=Path, help="start from these weights (a .pt this script wrote)")
    parser.add_argument("--recalibrate", type=int, default=50, help="batches to re-estimate BatchNorm statistics on")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    task, size = args.task, INPUT_SIZES[args.task]
    names = TASK_NAMES[task]
    model: torch.nn.Module = CropClassifier(len(names)) if task == "classify" else TaskModel(task, len(names))
    if args.init:
        model.load_state_dict(torch.load(args.init, map_location="cpu", weights_only=True)["state_dict"])
    model = model.to(device)
    ema = torch.optim.swa_utils.AveragedModel(
        model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.998), use_buffers=True
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=5e-4)
    if task == "classify":
        dataset: IterableDataset = CropFrames(size, args.seed)  # type: ignore[type-arg]
        loader = DataLoader(dataset, batch_size=args.batch * 2, num_workers=args.workers, worker_init_fn=_one_thread)
    else:
        dataset = TaskFrames(task, size, args.seed)
        loader = DataLoader(
            dataset, batch_size=args.batch, num_workers=args.workers, collate_fn=collate, worker_init_fn=_one_thread
        )
    start = time.time()
    model.train()
    warmup = 0.05
    step = 0
    for step, (images, targets) in enumerate(loader):
        progress = max(step / args.steps if args.steps else 1.0, (time.time() - start) / args.max_seconds)
        if progress >= 1.0:
            break
        factor = (
            progress / warmup
            if progress < warmup
            else 0.5 * (1 + math.cos(math.pi * (progress - warmup) / (1 - warmup)))
        )
        for group in optimizer.param_groups:
            group["lr"] = args.lr * max(factor, 0.01)
        images = images.to(device, non_blocking=True)
        if task == "classify":
            assert isinstance(model, CropClassifier)
            total = F.cross_entropy(model.logits(images), targets.to(device))
            parts = {"ce": total.item()}
        else:
            assert isinstance(model, TaskModel)
            total, parts = loss(model, images, [{k: v.to(device) for k, v in t.items()} for t in targets])
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        ema.update_parameters(model)
        if step % 500 == 499:
            save(ema.module, args.out, task, size, step + 1)
        if step % 100 == 0:
            text = "  ".join(f"{k} {v:.3f}" for k, v in parts.items())
            print(f"{task} step {step:5d}  loss {total.item():.3f}  {text}  {time.time() - start:.0f}s", flush=True)
    final = ema.module if step else model  # --steps 0: only recalibrate --init's weights
    recalibrate(final, loader, device, args.recalibrate)
    save(final, args.out, task, size, step)
    print(f"{task}: wrote {args.out} after {step} steps, {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
