"""What the tests of the operator's build tools share: the demo FP32 model, synthetic frames written as
images, a bundle built with optimisation options."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from testkit import DEMO_MODELS

FP32 = DEMO_MODELS / "demo_detector.onnx"


def write_frames(folder: Path, frames: list[np.ndarray]) -> Path:
    folder.mkdir()
    for i, frame in enumerate(frames):
        cv2.imwrite(str(folder / f"{i:03d}.png"), frame)
    return folder


def _build(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    from agent.cli import main

    status = main(["bundle", "build", *map(str, argv)])
    captured = capsys.readouterr()
    return status, captured.out, captured.err
