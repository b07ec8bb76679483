"""Raw outputs of query-decoder models made by hand (end2end rows, RT-DETR's score and box outputs) and
the metadata that names them."""

from __future__ import annotations

import numpy as np

from pipelines.decoding.decoder_choice import ModelHints

HW = (640, 640)


# (x1, y1, x2, y2, score, class) in input pixels
ROWS = [(100.0, 120.0, 300.0, 400.0, 0.9, 15.0), (400.0, 50.0, 620.0, 200.0, 0.6, 2.0)]


def end2end_output(normalised: bool = False, batch_index: bool = False, class_first: bool = False) -> np.ndarray:
    """(1, 300, 6) rows: ROWS, then low-score rows with whole class ids, then zero padding."""
    rng = np.random.default_rng(0)
    out = np.zeros((300, 6), np.float32)
    out[: len(ROWS)] = ROWS
    x1y1 = rng.uniform(0, 500, (100, 2))
    out[2:102, :2] = x1y1
    out[2:102, 2:4] = x1y1 + rng.uniform(1, 100, (100, 2))
    out[2:102, 4] = rng.uniform(0.01, 0.2, 100)
    out[2:102, 5] = rng.integers(0, 80, 100)
    if normalised:
        out[:, :4] /= 640.0
    if class_first:
        out[:, [4, 5]] = out[:, [5, 4]]
    if batch_index:
        out = np.concatenate([np.zeros((300, 1), np.float32), out], axis=1)
    return out[None]


def rtdetr_output(nc: int = 2) -> np.ndarray:
    rng = np.random.default_rng(2)
    out = np.zeros((300, 4 + nc), np.float32)
    out[:, :4] = rng.uniform(0.1, 0.5, (300, 4))
    out[:, 4:] = rng.uniform(0.0, 0.1, (300, nc))
    out[7, :4] = [0.5, 0.5, 0.25, 0.5]
    out[7, 4 + 1] = 0.8
    return out[None]


def rtdetr_rows() -> np.ndarray:
    """Ultralytics 8.4: (1, 300, 6) rows cx, cy, w, h, score, class, normalised."""
    out = rtdetr_output(2).copy()
    out[0, :, 5] = np.arange(300) % 80
    out[0, :, 4] = 0.01
    out[0, 7, 4:] = [0.8, 1]
    return out


E2E_META = ModelHints(num_classes=80, end2end=True)


RTDETR_META = ModelHints(num_classes=2, rtdetr=True)
