"""The project's own demo detector (PyTorch): written here, trained on the synthetic scene.

Needs the ``train`` extra (PyTorch); the daemon never imports this file. The network is a
small anchor-free detector: a strided conv backbone, a top-down feature pyramid at strides
8/16/32 and one head per level predicting box side distances and class logits per cell.

`DemoDetector.forward` returns the YOLOv8 export layout ``(B, 4 + nc, N)``: rows ``cx, cy, w, h``
normalised to 0..1 of the input (so an int8 output keeps its precision, as Ultralytics' TFLite
exports do), then ``nc`` sigmoid class scores; N = cells of the three levels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

STRIDES = (8, 16, 32)
#: box sizes (longest side, input pixels) each level learns: a box may belong to two levels
LEVEL_RANGES = ((0.0, 56.0), (40.0, 128.0), (96.0, 1e9))


class ConvBNAct(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int = 3, s: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class DemoDetector(nn.Module):
    def __init__(self, num_classes: int = 3) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.stem = nn.Sequential(ConvBNAct(3, 16, 3, 2), ConvBNAct(16, 24, 3, 2), ConvBNAct(24, 24))
        self.stage3 = nn.Sequential(ConvBNAct(24, 40, 3, 2), ConvBNAct(40, 40))  # stride 8
        self.stage4 = nn.Sequential(ConvBNAct(40, 64, 3, 2), ConvBNAct(64, 64))  # stride 16
        self.stage5 = nn.Sequential(ConvBNAct(64, 96, 3, 2), ConvBNAct(96, 96))  # stride 32
        self.lateral5 = nn.Conv2d(96, 64, 1)
        self.lateral4 = nn.Conv2d(64, 40, 1)
        self.heads = nn.ModuleList(
            nn.Sequential(ConvBNAct(c, c), nn.Conv2d(c, 4 + num_classes, 1)) for c in (40, 64, 96)
        )
        for head in self.heads:
            last = head[-1]
            assert isinstance(last, nn.Conv2d)
            nn.init.constant_(last.bias[4:], -4.0)  # start with low scores: most cells are background

    def levels(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Raw head outputs per level: ``(B, 4 + nc, H/s, W/s)`` (box side logits, class logits)."""
        c3 = self.stage3(self.stem(x))
        c4 = self.stage4(c3)
        c5 = self.stage5(c4)
        p4 = c4 + F.interpolate(self.lateral5(c5), size=c4.shape[-2:], mode="nearest")
        p3 = c3 + F.interpolate(self.lateral4(p4), size=c3.shape[-2:], mode="nearest")
        return [head(p) for head, p in zip(self.heads, (p3, p4, c5), strict=True)]

    @staticmethod
    def anchors(levels: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Cell centres ``(N, 2)`` in input pixels and strides ``(N, 1)``, level by level, row-major."""
        centres, strides = [], []
        for raw, stride in zip(levels, STRIDES, strict=True):
            h, w = raw.shape[-2:]
            ys = (torch.arange(h, device=raw.device, dtype=torch.float32) + 0.5) * stride
            xs = (torch.arange(w, device=raw.device, dtype=torch.float32) + 0.5) * stride
            gy, gx = torch.meshgrid(ys, xs, indexing="ij")
            centres.append(torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=1))
            strides.append(torch.full((h * w, 1), float(stride), device=raw.device))
        return torch.cat(centres), torch.cat(strides)

    @staticmethod
    def flatten(levels: list[torch.Tensor]) -> torch.Tensor:
        """``(B, 4 + nc, N)`` of raw outputs."""
        return torch.cat([raw.flatten(2) for raw in levels], dim=2)

    @staticmethod
    def boxes(raw: torch.Tensor, centres: torch.Tensor, strides: torch.Tensor) -> torch.Tensor:
        """xyxy boxes ``(B, N, 4)`` in input pixels from side logits ``(B, 4, N)``."""
        dist = F.softplus(raw[:, :4].transpose(1, 2)) * strides  # (B, N, 4): left, top, right, bottom
        return torch.cat([centres - dist[..., :2], centres + dist[..., 2:]], dim=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        levels = self.levels(x)
        centres, strides = self.anchors(levels)
        raw = self.flatten(levels)
        xyxy = self.boxes(raw, centres, strides)
        # (width, height) as a tensor op, so an export with dynamic height/width keeps it dynamic
        size = torch._shape_as_tensor(x)[2:].flip(0).to(torch.float32)
        cxcy = (xyxy[..., :2] + xyxy[..., 2:]) / 2 / size
        wh = (xyxy[..., 2:] - xyxy[..., :2]) / size
        box = torch.cat([cxcy, wh], dim=2).transpose(1, 2)
        return torch.cat([box, torch.sigmoid(raw[:, 4:])], dim=1)


def _giou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Generalised IoU of matching xyxy rows ``(n, 4)``."""
    inter_wh = (torch.min(a[:, 2:], b[:, 2:]) - torch.max(a[:, :2], b[:, :2])).clamp(min=0)
    inter = inter_wh[:, 0] * inter_wh[:, 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a + area_b - inter + 1e-7
    hull_wh = torch.max(a[:, 2:], b[:, 2:]) - torch.min(a[:, :2], b[:, :2])
    hull = hull_wh[:, 0] * hull_wh[:, 1] + 1e-7
    return inter / union - (hull - union) / hull


def assign(centres: torch.Tensor, strides: torch.Tensor, gt_boxes: torch.Tensor, radius: float = 1.5) -> torch.Tensor:
    """Index of the ground-truth box each cell learns, or -1 for background; ``(N,)``.

    A cell is positive for a box when its centre lies inside the box, within `radius` strides of
    the box centre, and the box's longest side is in the cell level's range. A cell claimed by
    several boxes learns the smallest.
    """
    if gt_boxes.numel() == 0:
        return torch.full((centres.shape[0],), -1, dtype=torch.long, device=centres.device)
    gt_centre = (gt_boxes[:, :2] + gt_boxes[:, 2:]) / 2  # (k, 2)
    inside = (centres[:, None, :] > gt_boxes[None, :, :2]).all(2) & (centres[:, None, :] < gt_boxes[None, :, 2:]).all(2)
    near = ((centres[:, None, :] - gt_centre[None]).abs() < radius * strides[:, :, None]).all(2)
    longest = (gt_boxes[:, 2:] - gt_boxes[:, :2]).max(1).values  # (k,)
    lo = torch.zeros_like(strides[:, 0])
    hi = torch.zeros_like(strides[:, 0])
    for stride, (low, high) in zip(STRIDES, LEVEL_RANGES, strict=True):
        on_level = strides[:, 0] == stride
        lo[on_level], hi[on_level] = low, high
    in_range = (longest[None] >= lo[:, None]) & (longest[None] <= hi[:, None])
    ok = inside & near & in_range  # (N, k)
    area = (gt_boxes[:, 2] - gt_boxes[:, 0]) * (gt_boxes[:, 3] - gt_boxes[:, 1])
    cost = torch.where(ok, area[None].expand_as(ok), torch.full_like(ok, float("inf"), dtype=torch.float32))
    best_cost, best = cost.min(1)
    return torch.where(torch.isfinite(best_cost), best, torch.full_like(best, -1))


def loss(
    model: DemoDetector, images: torch.Tensor, targets: list[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, dict[str, float]]:
    """Classification (BCE) + box (GIoU) loss. `targets`: per image (xyxy input pixels, classes)."""
    levels = model.levels(images)
    centres, strides = model.anchors(levels)
    raw = model.flatten(levels)
    boxes = model.boxes(raw, centres, strides)
    cls_logits = raw[:, 4:].transpose(1, 2)  # (B, N, nc)
    cls_target = torch.zeros_like(cls_logits)
    box_losses = []
    positives = 0
    for b, (gt_boxes, gt_classes) in enumerate(targets):
        owner = assign(centres, strides, gt_boxes)
        pos = owner >= 0
        if pos.any():
            cls_target[b, pos, gt_classes[owner[pos]]] = 1.0
            box_losses.append(1.0 - _giou(boxes[b, pos], gt_boxes[owner[pos]]))
            positives += int(pos.sum())
    norm = max(positives, 1)
    cls_loss = F.binary_cross_entropy_with_logits(cls_logits, cls_target, reduction="sum") / norm
    box_loss = torch.cat(box_losses).sum() / norm if box_losses else boxes.sum() * 0
    total = cls_loss + 2.0 * box_loss
    return total, {"cls": cls_loss.item(), "box": box_loss.item(), "positives": positives / len(targets)}


class ExportModel(nn.Module):
    """`DemoDetector` for a fixed input size, with its cell grid as constants: exported graphs
    then hold no integer index arithmetic (which int8 quantizers cannot observe).

    `nhwc` takes ``(B, H, W, 3)`` input, as TFLite models do; otherwise ``(B, 3, H, W)``.
    """

    def __init__(self, model: DemoDetector, size: int, nhwc: bool = False) -> None:
        super().__init__()
        self.model, self.nhwc = model, nhwc
        with torch.no_grad():
            levels = model.levels(torch.zeros(1, 3, size, size))
            centres, strides = model.anchors(levels)
        self.register_buffer("centres", centres)
        self.register_buffer("strides", strides)
        self.register_buffer("inverse_size", torch.full((2,), 1.0 / size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.nhwc:
            x = x.permute(0, 3, 1, 2)
        raw = self.model.flatten(self.model.levels(x))
        xyxy = self.model.boxes(raw, self.centres, self.strides)
        cxcy = (xyxy[..., :2] + xyxy[..., 2:]) * 0.5 * self.inverse_size
        wh = (xyxy[..., 2:] - xyxy[..., :2]) * self.inverse_size
        box = torch.cat([cxcy, wh], dim=2).transpose(1, 2)
        return torch.cat([box, torch.sigmoid(raw[:, 4:])], dim=1)
