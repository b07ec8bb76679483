"""The project's own small task models (PyTorch): segmentation, pose, oriented boxes and a crop
classifier, written here and trained on the synthetic scene (scripts/train_task_models.py).

Needs the ``train`` extra (PyTorch); the daemon never imports this file. No Ultralytics code:
the networks are the demo detector's design (scripts/demo_model.py: a strided conv backbone, a
top-down pyramid at strides 8/16/32, anchor-free heads predicting box side distances), with
heads whose *export layouts* are Ultralytics' (8.4), so the agent's decoders and Ultralytics'
own predictors read the same files:

- ``segment``: ``(B, 4+nc+32, N)`` (``cx, cy, w, h``, sigmoid class scores, 32 mask
  coefficients) and prototypes ``(B, 32, H/4, W/4)``;
- ``pose``: ``(B, 4+nc+K*3, N)`` with K keypoints ``x, y, sigmoid visibility``;
- ``obb``: ``(B, 4+nc+1, N)``: ``cx, cy, w, h`` of the rotated box, class scores, the angle
  in radians, in [-pi/4, 3pi/4);
- ``classify`` (`CropClassifier`): ``(B, nc)`` softmax probabilities.

Each detector also has a one-to-one score head (one positive cell per object, as YOLO26's
end-to-end head): `ExportTaskModel` with ``end2end`` gives the best 300 rows ``(B, 300, 6+e)``:
``x1, y1, x2, y2, score, class`` then the task's extra values (32 coefficients, K*3 keypoints;
for obb ``cx, cy, w, h, score, class, angle``). Coordinates are input pixels, or normalised 0..1
of the input for TFLite exports (`normalised`), as Ultralytics' exports do.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from demo_model import STRIDES, ConvBNAct, assign
from torch import nn

Task = Literal["segment", "pose", "obb"]
NUM_MASKS = 32
NUM_KEYPOINTS = 3
MAX_DET = 300
WIDTHS = (32, 48, 64)


def extra_channels(task: Task) -> int:
    return {"segment": NUM_MASKS, "pose": NUM_KEYPOINTS * 3, "obb": 1}[task]


class TaskModel(nn.Module):
    """A small anchor-free detector with a task head. `levels` gives per level
    ``(B, 4 + nc + nc + e, H/s, W/s)``: box side logits, one-to-many class logits, one-to-one
    class logits and the task's e extra values; `protos` (segment only) ``(B, 32, H/4, W/4)``."""

    def __init__(self, task: Task, num_classes: int) -> None:
        super().__init__()
        self.task, self.num_classes = task, num_classes
        c3, c4, c5 = WIDTHS
        self.stem = nn.Sequential(ConvBNAct(3, 16, 3, 2), ConvBNAct(16, 24, 3, 2), ConvBNAct(24, 24))
        self.stage3 = nn.Sequential(ConvBNAct(24, c3, 3, 2), ConvBNAct(c3, c3))
        self.stage4 = nn.Sequential(ConvBNAct(c3, c4, 3, 2), ConvBNAct(c4, c4))
        self.stage5 = nn.Sequential(ConvBNAct(c4, c5, 3, 2), ConvBNAct(c5, c5))
        self.lateral5 = nn.Conv2d(c5, c4, 1)
        self.lateral4 = nn.Conv2d(c4, c3, 1)
        out = 4 + 2 * num_classes + extra_channels(task)
        self.heads = nn.ModuleList(nn.Sequential(ConvBNAct(c, c), nn.Conv2d(c, out, 1)) for c in WIDTHS)
        for head in self.heads:
            last = head[-1]
            assert isinstance(last, nn.Conv2d)
            nn.init.constant_(last.bias[4 : 4 + 2 * num_classes], -4.0)
        if task == "segment":
            self.proto = nn.Sequential(
                ConvBNAct(c3, c3),
                nn.Upsample(scale_factor=2.0, mode="nearest"),
                ConvBNAct(c3 + 24, 32),
                nn.Conv2d(32, NUM_MASKS, 1),
            )

    def features(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        s4 = self.stem(x)
        c3 = self.stage3(s4)
        c4 = self.stage4(c3)
        c5 = self.stage5(c4)
        p4 = c4 + F.interpolate(self.lateral5(c5), size=c4.shape[-2:], mode="nearest")
        p3 = c3 + F.interpolate(self.lateral4(p4), size=c3.shape[-2:], mode="nearest")
        levels = [head(p) for head, p in zip(self.heads, (p3, p4, c5), strict=True)]
        protos = None
        if self.task == "segment":
            up = self.proto[1](self.proto[0](p3))
            protos = self.proto[3](self.proto[2](torch.cat([up, s4], dim=1)))
        return levels, protos

    @staticmethod
    def flatten(levels: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat([raw.flatten(2) for raw in levels], dim=2)

    def split(self, raw: torch.Tensor) -> dict[str, torch.Tensor]:
        """``(B, C, N)`` -> side logits, o2m and o2o class logits, extra values (each ``(B, c, N)``)."""
        nc = self.num_classes
        return {
            "sides": raw[:, :4],
            "o2m": raw[:, 4 : 4 + nc],
            "o2o": raw[:, 4 + nc : 4 + 2 * nc],
            "extra": raw[:, 4 + 2 * nc :],
        }


def anchors(levels: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell centres ``(N, 2)`` in input pixels and strides ``(N, 1)``."""
    centres, strides = [], []
    for raw, stride in zip(levels, STRIDES, strict=True):
        h, w = raw.shape[-2:]
        ys = (torch.arange(h, device=raw.device, dtype=torch.float32) + 0.5) * stride
        xs = (torch.arange(w, device=raw.device, dtype=torch.float32) + 0.5) * stride
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        centres.append(torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1))
        strides.append(torch.full((h * w, 1), float(stride), device=raw.device))
    return torch.cat(centres), torch.cat(strides)


def decode_boxes(
    parts: dict[str, torch.Tensor], task: Task, centres: torch.Tensor, strides: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(B, N, 4)`` boxes: xyxy input pixels, or for obb ``cx, cy, w, h`` of the rotated box;
    and for obb the angle ``(B, N)`` in [-pi/4, 3pi/4)."""
    dist = F.softplus(parts["sides"].transpose(1, 2)) * strides  # left, top, right, bottom
    if task != "obb":
        return torch.cat([centres - dist[..., :2], centres + dist[..., 2:]], dim=2), None
    angle = (torch.sigmoid(parts["extra"][:, 0]) - 0.25) * math.pi
    cos, sin = torch.cos(angle), torch.sin(angle)
    xf = (dist[..., 2] - dist[..., 0]) / 2
    yf = (dist[..., 3] - dist[..., 1]) / 2
    cx = xf * cos - yf * sin + centres[:, 0]
    cy = xf * sin + yf * cos + centres[:, 1]
    w = dist[..., 0] + dist[..., 2]
    h = dist[..., 1] + dist[..., 3]
    return torch.stack([cx, cy, w, h], dim=2), angle


def decode_keypoints(extra: torch.Tensor, centres: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
    """``(B, K*3, N)`` raw -> ``(B, N, K, 3)``: x, y in input pixels, visibility logits."""
    b, _, n = extra.shape
    raw = extra.view(b, NUM_KEYPOINTS, 3, n).permute(0, 3, 1, 2)
    xy = centres[None, :, None, :] + raw[..., :2] * 4.0 * strides[None, :, None, :]
    return torch.cat([xy, raw[..., 2:]], dim=3)


class ExportTaskModel(nn.Module):
    """`TaskModel` for a fixed input size in Ultralytics' export layout (see the module doc).

    `nhwc`: ``(B, H, W, 3)`` input as TFLite models take; `normalised`: coordinates as 0..1 of
    the input (TFLite); `end2end`: the best `MAX_DET` rows by the one-to-one scores.
    """

    def __init__(
        self, model: TaskModel, size: int, nhwc: bool = False, normalised: bool = False, end2end: bool = False
    ):
        super().__init__()
        self.model, self.size, self.nhwc, self.end2end = model, size, nhwc, end2end
        with torch.no_grad():
            levels, _ = model.features(torch.zeros(1, 3, size, size))
            centres, strides = anchors(levels)
        self.register_buffer("centres", centres)
        self.register_buffer("strides", strides)
        self.scale = 1.0 / size if normalised else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if self.nhwc:
            x = x.permute(0, 3, 1, 2)
        model = self.model
        levels, protos = model.features(x)
        parts = model.split(model.flatten(levels))
        boxes, angle = decode_boxes(parts, model.task, self.centres, self.strides)
        boxes = boxes * self.scale
        scores = torch.sigmoid(parts["o2o" if self.end2end else "o2m"]).transpose(1, 2)  # (B, N, nc)
        if model.task == "segment":
            extra = parts["extra"].transpose(1, 2)
        elif model.task == "pose":
            kpts = decode_keypoints(parts["extra"], self.centres, self.strides)
            xy, vis = kpts[..., :2] * self.scale, torch.sigmoid(kpts[..., 2:])
            extra = torch.cat([xy, vis], dim=3).flatten(2)
        else:
            assert angle is not None
            extra = angle[..., None]
        if not self.end2end:
            if model.task != "obb":
                xyxy = boxes
                boxes = torch.cat([(xyxy[..., :2] + xyxy[..., 2:]) / 2, xyxy[..., 2:] - xyxy[..., :2]], dim=2)
            out = torch.cat([boxes, scores, extra], dim=2).transpose(1, 2)
            return (out, protos) if protos is not None else out
        best, _ = scores.max(dim=2)
        top, index = best.topk(MAX_DET, dim=1)
        gather = index[..., None]
        rows_box = boxes.gather(1, gather.expand(-1, -1, 4))
        if scores.shape[2] == 1:  # one class: argmax over it does not convert to TFLite
            rows_cls = torch.zeros_like(top)[..., None]
        else:
            rows_cls = scores.gather(1, gather.expand(-1, -1, scores.shape[2])).argmax(dim=2, keepdim=True).float()
        rows_extra = extra.gather(1, gather.expand(-1, -1, extra.shape[2]))
        out = torch.cat([rows_box, top[..., None], rows_cls, rows_extra], dim=2)
        return (out, protos) if protos is not None else out


def _giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    inter_wh = (torch.min(a[:, 2:], b[:, 2:]) - torch.max(a[:, :2], b[:, :2])).clamp(min=0)
    inter = inter_wh[:, 0] * inter_wh[:, 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a + area_b - inter + 1e-7
    hull_wh = torch.max(a[:, 2:], b[:, 2:]) - torch.min(a[:, :2], b[:, :2])
    hull = hull_wh[:, 0] * hull_wh[:, 1] + 1e-7
    return inter / union - (hull - union) / hull


def _obb_variants(obb: torch.Tensor, vertices: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """``(k, 3, 5)``: a triangle's three equally right rotated boxes (each vertex as the apex,
    from its `vertices` ``(k, 3, 2)``); for circles and squares three copies of their `obb`."""
    centroid = vertices.mean(dim=1)
    out = []
    for apex in range(3):
        tip = vertices[:, apex]
        base = vertices[:, (apex + 2) % 3] - vertices[:, (apex + 1) % 3]
        r = (tip - centroid).norm(dim=1)
        centre = centroid + (tip - centroid) / 4
        theta = torch.atan2(base[:, 1], base[:, 0]) % math.pi
        tri = torch.stack([centre[:, 0], centre[:, 1], base.norm(dim=1), 1.5 * r, theta], dim=1)
        out.append(torch.where((classes == 2)[:, None], tri, obb))
    return torch.stack(out, dim=1)


def _angle_loss(pred: torch.Tensor, target: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """1 - cos of the angle error at the box's symmetry: none for circles, pi/2 for squares,
    pi for triangles' boxes."""
    order = torch.where(classes == 0, 0.0, torch.where(classes == 1, 4.0, 2.0)).to(pred.dtype)
    return (1 - torch.cos(order[:, None] * (pred[:, None] - target))) * (order[:, None] > 0)


def loss(
    model: TaskModel, images: torch.Tensor, targets: list[dict[str, torch.Tensor]]
) -> tuple[torch.Tensor, dict[str, float]]:
    """BCE class losses (one-to-many and one-to-one), box loss (GIoU, or for obb centre, log size
    and angle), and the task's: mask BCE inside the box, keypoint L1 and visibility BCE.
    `targets` per image: ``xyxy`` (k, 4) input pixels, ``classes`` (k,), and ``obb`` (k, 5),
    ``keypoints`` (k, K, 3), ``masks`` (k, H/4, W/4) float as the task needs."""
    levels, protos = model.features(images)
    centres, strides = anchors(levels)
    parts = model.split(model.flatten(levels))
    boxes, angle = decode_boxes(parts, model.task, centres, strides)
    o2m = parts["o2m"].transpose(1, 2)
    o2o = parts["o2o"].transpose(1, 2)
    o2m_target = torch.zeros_like(o2m)
    o2o_target = torch.zeros_like(o2o)
    box_terms, task_terms = [], []
    positives = 0
    for b, t in enumerate(targets):
        owner = assign(centres, strides, t["xyxy"])
        pos = torch.nonzero(owner >= 0).flatten()
        if pos.numel() == 0:
            continue
        gt = owner[pos]
        classes = t["classes"][gt]
        o2m_target[b, pos, classes] = 1.0
        positives += int(pos.numel())
        if model.task == "obb":
            assert angle is not None
            variants = _obb_variants(t["obb"], t["keypoints"][..., :2], t["classes"])[gt]  # (p, 3, 5)
            pred = boxes[b, pos]
            scale = variants[:, 0, 2:4].mean(1, keepdim=True).clamp(min=1.0)
            centre = (pred[:, None, :2] - variants[..., :2]).abs().sum(2) / scale
            size = (torch.log(pred[:, None, 2:4].clamp(min=1e-3)) - torch.log(variants[..., 2:4])).abs().sum(2)
            turn = _angle_loss(angle[b, pos], variants[..., 4], classes)
            per = (centre + size + 2.0 * turn).min(dim=1).values
            box_terms.append(per)
            closeness = torch.exp(-per.detach())
        else:
            per = 1.0 - _giou(boxes[b, pos], t["xyxy"][gt])
            box_terms.append(per)
            closeness = (1.0 - per.detach()).clamp(min=0)
        # one-to-one: each object's best cell (score x closeness) is its only positive
        quality = torch.sigmoid(o2m[b, pos, classes].detach()) * closeness
        best = torch.full((len(t["classes"]),), -1.0, device=images.device).scatter_reduce(0, gt, quality, "amax")
        chosen = quality >= best[gt]
        o2o_target[b, pos[chosen], classes[chosen]] = 1.0
        if model.task == "segment":
            assert protos is not None
            keep = torch.randperm(pos.numel(), device=images.device)[:64]
            coeff = parts["extra"][b, :, pos[keep]].T  # (p, 32)
            logits = torch.einsum("pc,chw->phw", coeff, protos[b])
            target = t["masks"][gt[keep]]
            hp, wp = logits.shape[1:]
            box = t["xyxy"][gt[keep]] / 4.0
            xs = torch.arange(wp, device=images.device)[None, None, :] + 0.5
            ys = torch.arange(hp, device=images.device)[None, :, None] + 0.5
            inside = (
                (xs >= box[:, 0, None, None])
                & (xs <= box[:, 2, None, None])
                & (ys >= box[:, 1, None, None])
                & (ys <= box[:, 3, None, None])
            ).float()
            bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none") * inside
            task_terms.append(bce.sum((1, 2)) / inside.sum((1, 2)).clamp(min=1.0))
        elif model.task == "pose":
            kpts = decode_keypoints(parts["extra"][b : b + 1, :, pos], centres[pos], strides[pos])[0]  # (p, K, 3)
            truth = t["keypoints"][gt]  # (p, K, 3)
            scale = (t["xyxy"][gt, 2:] - t["xyxy"][gt, :2]).mean(1).clamp(min=1.0)
            shifted = torch.stack([truth.roll(s, dims=1) for s in range(NUM_KEYPOINTS)], dim=1)  # (p, 3, K, 3)
            vis = shifted[..., 2]
            dist = ((kpts[:, None, :, :2] - shifted[..., :2]).abs().sum(3) * vis).sum(2) / scale[:, None]
            vis_bce = F.binary_cross_entropy_with_logits(
                kpts[:, None, :, 2].expand_as(vis), vis, reduction="none"
            ).mean(2)
            task_terms.append((5.0 * dist + vis_bce).min(dim=1).values)
    norm = max(positives, 1)
    cls_loss = F.binary_cross_entropy_with_logits(o2m, o2m_target, reduction="sum") / norm
    objects = sum(len(t["classes"]) for t in targets)
    o2o_loss = F.binary_cross_entropy_with_logits(o2o, o2o_target, reduction="sum") / max(objects, 1)
    box_loss = torch.cat(box_terms).sum() / norm if box_terms else boxes.sum() * 0
    task_loss = torch.cat(task_terms).mean() if task_terms else boxes.sum() * 0
    total = cls_loss + o2o_loss + 2.0 * box_loss + 2.0 * task_loss
    return total, {
        "cls": cls_loss.item(),
        "o2o": o2o_loss.item(),
        "box": box_loss.item(),
        "task": task_loss.item(),
        "positives": positives / len(targets),
    }


class CropClassifier(nn.Module):
    """A small classifier of one object's crop: ``(B, 3, S, S)`` RGB /255 -> ``(B, nc)`` softmax
    (``nhwc``: ``(B, S, S, 3)`` input). `logits` gives the scores before softmax, for training."""

    def __init__(self, num_classes: int, nhwc: bool = False) -> None:
        super().__init__()
        self.nhwc = nhwc
        self.body = nn.Sequential(
            ConvBNAct(3, 16, 3, 2),
            ConvBNAct(16, 32, 3, 2),
            ConvBNAct(32, 32),
            ConvBNAct(32, 64, 3, 2),
            ConvBNAct(64, 64),
            ConvBNAct(64, 96, 3, 2),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.fc = nn.Linear(96, num_classes)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.nhwc:
            x = x.permute(0, 3, 1, 2)
        out: torch.Tensor = self.fc(self.body(x))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(x), dim=1)
