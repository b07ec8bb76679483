"""`agent.optimise.rknn_build`: rknn-toolkit2 run in its own venv as a subprocess. Without the
toolkit: the missing venv and a failing toolkit named as `bundle build` codes. With it (marked
``rknn``: scripts/test_rknn.sh): the demo detector converted for the RK3588, FP16 and INT8, its
simulator's outputs decoded by the ONNX model's path and measured against ONNX Runtime's."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from testkit.optimise import FP32
from testkit.rknn_double import toolkit_python

from agent.errors import BundleError
from agent.optimise.rknn_build import convert
from agent.optimise.rknn_build import toolkit_python as find_toolkit
from pipelines.sources.synthetic import SyntheticScene
from runtimes.rknn_backend import RKNNRecord

CALIBRATION = [SyntheticScene(seed=3, width=640, height=480).render(i)[0] for i in range(0, 40, 4)]
VALIDATION = [SyntheticScene(seed=7, width=640, height=480).render(i)[0] for i in range(0, 40, 8)]


def test_no_toolkit_venv_is_build_tools_missing_saying_how(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EDGE_AGENT_RKNN_PYTHON", raising=False)
    with pytest.raises(BundleError, match=r"BUILD_TOOLS_MISSING: .*pip install rknn-toolkit2"):
        find_toolkit(None)
    monkeypatch.setenv("EDGE_AGENT_RKNN_PYTHON", str(tmp_path / "nowhere" / "python"))
    with pytest.raises(BundleError, match="BUILD_TOOLS_MISSING"):
        find_toolkit(None)


def test_the_toolkit_side_refuses_int8_without_a_dataset_before_importing_the_toolkit(capsys) -> None:
    """The side script checks its arguments first: no rknn import (absent here) for a bad call."""
    from agent.optimise import rknn_convert

    with pytest.raises(SystemExit) as exited:
        rknn_convert.main(["--onnx", "m.onnx", "--platform", "rk3588", "--out", "m.rknn", "--inputs", "[]"])
    assert exited.value.code == 2 and "INT8 needs --dataset (or --fp16)" in capsys.readouterr().err
    assert "rknn" not in sys.modules and "rknn.api" not in sys.modules


def test_a_toolkit_that_refuses_the_model_is_model_check_failed_quoting_its_log(tmp_path: Path) -> None:
    """A stand-in for the toolkit's python that fails as the side script does (exit 2, its log on stderr)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'E load_onnx: unsupported op Einsum' >&2\nexit 2\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(BundleError, match=r"MODEL_CHECK_FAILED: --rknn rk3588: .*unsupported op Einsum"):
        convert(FP32, "rk3588", tmp_path / "m.rknn", python, CALIBRATION[:2], VALIDATION[:1])
    assert not (tmp_path / "m.rknn.json").exists(), "no record for a model that was not made"


def test_a_toolkit_that_exits_0_without_its_report_is_model_check_failed(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'I rknn building done.'\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(
        BundleError, match=r"MODEL_CHECK_FAILED: --rknn rk3588: rknn-toolkit2 exited 0 without its report"
    ):
        convert(FP32, "rk3588", tmp_path / "m.rknn", python, CALIBRATION[:2], VALIDATION[:1])


@pytest.mark.rknn
@pytest.mark.slow
@pytest.mark.parametrize(("fp16", "gate"), [(True, 1.0), (False, 0.9)])
def test_the_simulator_s_detections_pass_the_gate_against_onnx_runtime(fp16: bool, gate: float, tmp_path: Path) -> None:
    """The real toolkit: FP16 finds every ONNX Runtime detection, INT8 at least the gate's 90%."""
    out = tmp_path / "demo.rknn"
    done = convert(FP32, "rk3588", out, toolkit_python(), [] if fp16 else CALIBRATION, VALIDATION, fp16=fp16)
    assert done.measured.baseline_detections > 10
    assert done.measured.agreement is not None and done.measured.agreement >= gate, done.measured
    record = RKNNRecord.read(out)
    assert (record.platform, record.quantization) == ("rk3588", "fp16" if fp16 else "i8")
    assert record.toolkit_version.startswith("2.") and out.stat().st_size > 100_000
