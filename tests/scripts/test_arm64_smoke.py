"""`scripts/arm64_smoke.py`'s comparison of detections."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from testkit import REPO

SCRIPT = REPO / "scripts" / "arm64_smoke.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("arm64_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def row(label: str, box: list[float], score: float = 0.9) -> dict[str, Any]:
    return {"label": label, "class_id": {"circle": 0, "square": 1, "triangle": 2}[label], "score": score, "box": box}


CAT = row("circle", [100, 100, 200, 200])


BOX = row("square", [300, 50, 400, 160])


@pytest.mark.parametrize(
    ("other", "problem"),
    [
        ([BOX, CAT], None),
        ([row("circle", [101, 99, 201, 202], 0.8), row("square", [302, 50, 401, 158], 0.95)], None),
        ([row("circle", [110, 110, 210, 210]), BOX], "1 of 2 reference boxes matched"),  # IoU 0.68
        ([row("triangle", [100, 100, 200, 200]), BOX], "1 extra, 1 missing"),
        ([CAT, BOX, row("circle", [500, 300, 550, 350])], "1 extra, 0 missing"),
        ([CAT], "0 extra, 1 missing"),
        ([], "0 extra, 2 missing"),
    ],
)
def test_compare_needs_the_same_labels_at_iou_09(other: list[dict[str, Any]], problem: str | None) -> None:
    found = _script().compare([CAT, BOX], other)
    assert found == problem if problem is None else (found is not None and problem in found)


def test_an_empty_reference_proves_nothing() -> None:
    assert _script().compare([], []) == "the reference found nothing to compare"


def test_compare_command_reads_detect_json(tmp_path: Path) -> None:
    def write(name: str, rows: list[dict[str, Any]]) -> Path:
        path = tmp_path / name
        path.write_text(json.dumps({"image": "scene.png", "runtime": "litert", "detections": rows}) + "\n")
        return path

    same = subprocess.run([sys.executable, str(SCRIPT), "compare", str(write("a", [CAT])), str(write("b", [CAT]))])
    differ = subprocess.run([sys.executable, str(SCRIPT), "compare", str(write("c", [CAT])), str(write("d", [BOX]))])
    assert (same.returncode, differ.returncode) == (0, 1)
