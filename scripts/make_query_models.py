#!/usr/bin/env python3
"""Write the small LiteRT test models of the query decoders: tests/data/query_models/*.tflite.

Each is the project's own graph (no trained weights): known output rows plus the input times
zero, converted by litert-torch, so `tests/e2e/test_exports.py` runs the end2end, rtdetr and
detr decoders through the real LiteRT interpreter. The rows are the ones those tests expect
(`QUERY_ROWS` there). Needs torch and litert-torch, kept out of the project's environment:

    python3 -m venv /tmp/lt && /tmp/lt/bin/pip install torch litert-torch
    /tmp/lt/bin/python scripts/make_query_models.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "query_models"
SIZE = 64


def rows() -> dict[str, list[np.ndarray]]:
    """Outputs per model: one object (normalised box 0.5, 0.5, 0.5, 0.8, class 15, score 0.91)."""
    rng = np.random.default_rng(7)
    e2e = np.zeros((1, 300, 6), np.float32)
    e2e[0, 0] = [16, 6.4, 48, 57.6, 0.91, 15]  # x1, y1, x2, y2 in input pixels, score, class
    rtdetr = np.zeros((1, 300, 6), np.float32)
    rtdetr[0, :, :4] = rng.uniform(0.2, 0.4, (300, 4))
    rtdetr[0, :, 4] = np.sort(rng.uniform(0.001, 0.02, 300))[::-1]
    rtdetr[0, :, 5] = rng.integers(0, 80, 300)
    rtdetr[0, 0] = [0.5, 0.5, 0.5, 0.8, 0.91, 15]
    boxes = rng.uniform(0.2, 0.4, (1, 300, 4)).astype(np.float32)
    boxes[0, 9] = [0.5, 0.5, 0.5, 0.8]
    logits = rng.uniform(-9.0, -5.0, (1, 300, 91)).astype(np.float32)
    logits[0, 9, 15] = 8.0
    return {"end2end": [e2e], "rtdetr": [rtdetr], "detr": [boxes, logits]}


class Constant(torch.nn.Module):
    def __init__(self, outputs: list[np.ndarray]) -> None:
        super().__init__()
        for i, value in enumerate(outputs):
            self.register_buffer(f"out{i}", torch.from_numpy(value))
        self.count = len(outputs)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        zero = images.mean() * 0.0
        return tuple(getattr(self, f"out{i}") + zero for i in range(self.count))


def main() -> None:
    import litert_torch

    OUT.mkdir(parents=True, exist_ok=True)
    sample = (torch.zeros(1, 3, SIZE, SIZE),)
    for name, outputs in rows().items():
        model = litert_torch.convert(Constant(outputs).eval(), sample)
        model.export(str(OUT / f"{name}.tflite"))
        print(OUT / f"{name}.tflite")


if __name__ == "__main__":
    main()
