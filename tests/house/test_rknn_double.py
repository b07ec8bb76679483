"""The double of rknn-toolkit-lite2's `RKNNLite` (`testkit.rknn_double`) against the API of the
real toolkit: rknn-toolkit-lite2 is aarch64-only, but rknn-toolkit2's `RKNN` (x86-64, its own
venv) declares the same runtime methods and core-mask constants, so the double's signatures and
constants are compared with those read from it (marked ``rknn``: scripts/test_rknn.sh)."""

from __future__ import annotations

import inspect
import json
import subprocess

import pytest
from testkit.rknn_double import RKNNLite, toolkit_python

READ = """
import inspect, json
from rknn.api import RKNN
methods = {n: [p for p in inspect.signature(getattr(RKNN, n)).parameters if p != "self"]
           for n in ("load_rknn", "inference", "release")}
defaults = {n: p.default for n, p in inspect.signature(RKNN.inference).parameters.items() if n != "self"
            and p.default is not inspect.Parameter.empty}
consts = {n: getattr(RKNN, n) for n in dir(RKNN) if n.startswith("NPU_CORE_")}
init = inspect.signature(RKNN.init_runtime).parameters["core_mask"].default
print(json.dumps({"methods": methods, "defaults": defaults, "consts": consts, "core_mask": init}))
"""


@pytest.mark.rknn
def test_the_double_has_the_toolkit_s_runtime_methods_and_constants() -> None:
    run = subprocess.run([str(toolkit_python()), "-I", "-c", READ], capture_output=True, text=True, check=True)
    real = json.loads(run.stdout.strip().splitlines()[-1])
    for name, params in real["methods"].items():
        ours = [p for p in inspect.signature(getattr(RKNNLite, name)).parameters if p != "self"]
        assert ours == params, name
    ours_defaults = {
        n: p.default
        for n, p in inspect.signature(RKNNLite.inference).parameters.items()
        if n != "self" and p.default is not inspect.Parameter.empty
    }
    assert ours_defaults == real["defaults"]
    assert {n: getattr(RKNNLite, n) for n in real["consts"]} == real["consts"]
    assert inspect.signature(RKNNLite.init_runtime).parameters["core_mask"].default == real["core_mask"]
