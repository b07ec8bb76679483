"""Detection must not depend on the exact shared files: the same network rewritten into other
export layouts (transposed output, normalised boxes, objectness column, no metadata) must give
the same detections. The variants are built here with onnx graph edits on the shared model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agent.cli import main

onnx = pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402

from tests.onnx_tools import rewrite  # noqa: E402


def transposed(src: Path, dst: Path) -> Path:
    return rewrite(src, dst, [helper.make_node("Transpose", ["raw0"], ["output0"], perm=[0, 2, 1])], [], [1, 8400, 84])


def normalised(src: Path, dst: Path) -> Path:
    scale = np.ones((1, 84, 1), np.float32)
    scale[0, :4] = 1 / 640
    return rewrite(
        src,
        dst,
        [helper.make_node("Mul", ["raw0", "scale"], ["output0"])],
        [numpy_helper.from_array(scale, "scale")],
        [1, 84, 8400],
    )


def with_objectness(src: Path, dst: Path) -> Path:
    """(1, 8400, 85): boxes, objectness 1.0, class scores (a YOLOv5-style row layout)."""
    nodes = [
        helper.make_node("Transpose", ["raw0"], ["t"], perm=[0, 2, 1]),
        helper.make_node("Split", ["t", "split"], ["box", "cls"], axis=2),
        helper.make_node("Concat", ["box", "obj", "cls"], ["output0"], axis=2),
    ]
    inits = [
        numpy_helper.from_array(np.array([4, 80], np.int64), "split"),
        numpy_helper.from_array(np.ones((1, 8400, 1), np.float32), "obj"),
    ]
    return rewrite(src, dst, nodes, inits, [1, 8400, 85])


def no_metadata(src: Path, dst: Path) -> Path:
    return rewrite(
        src, dst, [helper.make_node("Identity", ["raw0"], ["output0"])], [], [1, 84, 8400], keep_metadata=False
    )


def detections(capsys, model: Path, image: Path, *extra: str) -> list[dict]:
    assert main(["detect", str(model), str(image), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)["detections"]


@pytest.mark.parametrize("variant", [transposed, normalised, with_objectness, no_metadata])
def test_variants_match_the_original(shared_models, photos, tmp_path, capsys, variant) -> None:
    original = shared_models / "yolov8n_int8_640.onnx"
    model = variant(original, tmp_path / f"{variant.__name__}.onnx")
    labels = ["--labels", str(shared_models / "coco80_labels.txt")]
    for name in ("astronaut", "coffee"):
        want = detections(capsys, original, photos[name])
        got = detections(capsys, model, photos[name], *labels)
        assert [d["label"] for d in got] == [d["label"] for d in want]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g["box"], w["box"], atol=1.0)
            assert g["score"] == pytest.approx(w["score"], abs=1e-3)
