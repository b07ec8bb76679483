"""The oldest supported versions: every device dependency has a lower bound; the demo models' opsets."""

from __future__ import annotations

import os
import re
import subprocess
from importlib import metadata

import onnx
import pytest
from testkit import DEMO_MODELS, REPO

#: extras that only developers and operators install
NOT_ON_DEVICES = ("dev", "train", "mutation")  # mutation: mutmut pinned, its results differ by version


def test_every_device_dependency_has_a_lower_bound() -> None:
    """uv's ``--resolution lowest-direct`` installs the lowest version a range allows: a
    dependency without one would get an ancient release instead of a tested one."""
    requirements = metadata.requires("edge-agent") or []
    device = [r for r in requirements if not any(f'extra == "{extra}"' in r for extra in NOT_ON_DEVICES)]
    assert device and [r for r in device if not re.search(r">=\s*\d", r)] == []


@pytest.mark.parametrize("model", sorted(p.name for p in DEMO_MODELS.glob("*.onnx")))
def test_demo_onnx_models_import_only_the_opsets_they_use(model: str) -> None:
    """A model that names an opset newer than a runtime knows is refused, used or not: the QDQ
    model named ai.onnx.ml 5 (stamped by the quantizer) and ONNX Runtime 1.17 refused it."""
    graph = onnx.load(str(DEMO_MODELS / model))
    used = {node.domain for node in graph.graph.node} | {""}
    assert {opset.domain for opset in graph.opset_import} <= used


def test_the_oldest_run_without_python_310_says_so(tmp_path) -> None:
    env = {**os.environ, "PYTHON_OLDEST": str(tmp_path / "no-python")}
    script = str(REPO / "scripts" / "test.sh")
    tolerant = subprocess.run([script, "--oldest", "--if-available"], env=env, capture_output=True, text=True)
    assert tolerant.returncode == 0 and "oldest-versions run skipped: no Python 3.10 found" in tolerant.stdout
    strict = subprocess.run([script, "--oldest"], env=env, capture_output=True, text=True)
    assert strict.returncode == 1 and "set PYTHON_OLDEST" in strict.stderr
